"""lib/cost.py's allocator setting (reuse_freed_memory): a CPU training step that page-faults its freed logits back in
every step, and one that reuses them."""
import os

import pytest


def test_reuse_freed_memory_stops_the_page_faults_of_a_training_step_with_gpt2s_vocabulary():
    # In a fresh process each: a training step of a small model with GPT-2's 50,257-token head (logits of 100 MiB).
    # glibc unmaps such blocks when freed, so every step faults them back in (~0.4 GiB of pages); with
    # reuse_freed_memory the freed blocks are reused and a later step faults in (almost) nothing.
    import subprocess, sys
    code = """if 1:
        import resource, sys, torch, model
        from lib import cost
        on = sys.argv[1] == "on" and cost.reuse_freed_memory()
        gpt = model.GPT(model.GPTConfig(n_layer=1, n_head=2, n_embd=32, ffn_hidden=64, block_size=128))
        x = torch.randint(0, 50257, (4, 128))
        per_step = []
        for i in range(6):
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            gpt(x, x)[1].backward()
            per_step.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
        print(int(on), min(per_step[3:]))"""  # the quietest of the steps after the heap has grown
    runs = {mode: subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, check=True,
                                 cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))).stdout.split()
            for mode in ("off", "on")}
    if runs["on"][0] == "0":
        pytest.skip("not glibc: reuse_freed_memory is a no-op here")
    off, on = int(runs["off"][1]), int(runs["on"][1])
    assert off > 50_000 and on < off / 10, runs
