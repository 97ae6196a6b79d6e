"""
Checkpoints and their provenance: what every checkpoint and result file records (run_info), the atomic save, the
safe read (weights_only=True: a file that carries code is refused, never run), the model a checkpoint or a task run
builds (load_checkpoint, build_model).
"""
import hashlib, importlib.metadata, importlib.util, os, subprocess, zipfile

import torch

import tasks
from model import GPT, GPTConfig, RealGPT

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def _git(repo, *args):
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=5, cwd=repo).stdout
    except (OSError, subprocess.SubprocessError):
        return ""

def pick_device(name):
    """A script's --device -> torch.device (auto: cuda if available, else cpu), or ValueError: one line saying why."""
    name = ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device {name!r} is not a device: use auto, cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available here")
    return device

def run_info(seed=None, repo=REPO):
    """What every checkpoint and result file records: git SHA, whether tracked files differed from it (git_dirty)
    and a hash of that diff, versions, device, seed. Untracked files (out_dirs, data) and results/ (reproduce.py
    rewrites its tracked summaries) are not counted: the flag says whether the code was committed."""
    sha = _git(repo, "rev-parse", "HEAD").strip() or None
    diff = _git(repo, "diff", "HEAD", "--", ":(top)", ":(top,exclude)results") if sha else ""
    triton = importlib.util.find_spec("triton") and importlib.metadata.version("triton")
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    # str(): weights_only refuses a TorchVersion
    return dict(git_sha=sha, git_dirty=bool(diff) if sha else None,
                git_diff_sha256=hashlib.sha256(diff.encode()).hexdigest()[:16] if diff else None,
                torch=str(torch.__version__), triton=triton or None, device=device, seed=seed)

def save_checkpoint(obj, path):
    """Atomic (temp file + rename): a crash mid-write leaves the previous checkpoint intact."""
    tmp = f"{path}.tmp"
    try:
        torch.save(obj, tmp)
    except BaseException:  # disk full or Ctrl-C: leave no partial file
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    os.replace(tmp, path)

class CheckpointError(ValueError):
    """A file that is not a checkpoint this code loads safely; the message is one line naming the file."""

def read_checkpoint(path, device="cpu", mmap=False):
    """The dict train.py saved, read with weights_only=True (tensors and plain containers: a file that carries code
    is refused, never run); mmap=True maps the tensors instead of reading them, a cheap check of a file."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{path!r} is a directory, expected a checkpoint file" if os.path.isdir(path)
                              else f"checkpoint {path!r} does not exist")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip; all else stops here
        raise CheckpointError(f"{path!r} is not a checkpoint: not a torch.save zip archive ({os.path.getsize(path):,} "
                              "bytes: empty, truncated or another kind of file)")
    try:  # old checkpoints hold a TorchVersion: allow it
        with torch.serialization.safe_globals([torch.torch_version.TorchVersion]):
            ckpt = torch.load(path, map_location=device, weights_only=True, mmap=mmap)
    except Exception as e:  # a refused global (could run code) or bad archive
        refused = str(e).partition("GLOBAL ")[2].split(" ")[0]
        why = (f"it refers to {refused}, which weights_only=True refuses (tensors and plain values only)" if refused
               else f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}")
        raise CheckpointError(f"checkpoint {path!r} cannot be loaded safely: {why}") from None
    if not isinstance(ckpt, dict) or not {"model", "model_args"} <= ckpt.keys():
        raise CheckpointError(f"{path!r} is not a nanoscorer checkpoint (no model or model_args)")
    return ckpt

def load_checkpoint(path, device="cpu", **overrides):
    """GPT from a checkpoint written by train.py (read_checkpoint); overrides change config fields (e.g. backend)."""
    ckpt = read_checkpoint(path, device)
    try:
        model = GPT(GPTConfig(**{**ckpt["model_args"], **overrides}))
        model.load_state_dict(ckpt["model"])
    except (TypeError, ValueError, RuntimeError) as e:  # args or weights this model.py doesn't take
        why = " ".join(l.strip() for l in str(e).splitlines())[:300]  # load_state_dict's message spans lines
        raise CheckpointError(f"{path!r} does not fit this model: {type(e).__name__}: {why}") from None
    return model.to(device), ckpt

def build_model(config, task=""):
    """The model a run of `task` trains: GPT for tokens, RealGPT for reals."""
    t = tasks.TASKS.get(task)
    return RealGPT(config, t.n_in, t.loss) if t and t.n_in else GPT(config)
