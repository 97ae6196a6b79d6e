"""Test-wide environment: set before any project module (and Triton) is imported."""
import os
import sys
import tempfile

# Triton kernels run on the CPU through the interpreter (must be set before triton is imported).
os.environ.setdefault("TRITON_INTERPRET", "1")
# Never reach for the Hugging Face hub: a hub name fails in 1 s instead of hanging in retries.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TIKTOKEN_CACHE_DIR", os.path.join(tempfile.gettempdir(), "nanoscorer-tiktoken-test"))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
