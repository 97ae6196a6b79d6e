"""
Checkpoints and their provenance: what every checkpoint and result file records (run_info), the atomic save, the
safe read (weights_only=True: a file that carries code is refused, never run), the model a checkpoint or a task run
builds (load_checkpoint, build_model; RealGPT for the real-valued tasks), the config a resume continues
(saved_config) and which runs it may start (check_task, loaded_inits), what a run's out_dir may hold before a run
writes there (check_out_dir), and the dataset an evaluation reads by default (trained_on; the splits' record a run
keeps and an evaluation compares: lib/provenance.py).
"""
import dataclasses, hashlib, importlib.metadata, importlib.util, os, re, subprocess, zipfile

import torch
import torch.nn as nn
import torch.nn.functional as F

import tasks
from lib import folders, tracking
from lib.provenance import data_folder, splits_kept
from model import GPT, GPTConfig, param_name
from scorers import SCORERS

RUN_FILES = ("ckpt.pt", "best.pt", "log.jsonl")  # what a run leaves in its out_dir
# config fields added since checkpoints were first written: the value an older run behaved as, not today's default
ADDED_FIELDS = {"sft_val_frac": 0.0}  # before it, every SFT example trained

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
    """What every checkpoint and result file records: git SHA (a copy without git: $NANOSCORER_GIT_SHA, dirty None),
    whether tracked files differed from it (git_dirty) and that diff's hash, versions, device, the CPU kernels'
    instruction set (cpu_capability), seed. Untracked files and results/ (reproduce.py rewrites its summaries) are not
    counted: the flag says whether the code was committed."""
    sha = _git(repo, "rev-parse", "HEAD").strip() or None
    diff = _git(repo, "diff", "HEAD", "--", ":(top)", ":(top,exclude)results") if sha else ""
    triton = importlib.util.find_spec("triton") and importlib.metadata.version("triton")
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    # str(): weights_only refuses a TorchVersion
    return dict(git_sha=sha or os.environ.get("NANOSCORER_GIT_SHA") or None, git_dirty=bool(diff) if sha else None,
                git_diff_sha256=hashlib.sha256(diff.encode()).hexdigest()[:16] if diff else None,
                torch=str(torch.__version__), triton=triton or None, device=device,
                # AVX2 and AVX512 kernels round differently: runs repeat bit for bit only within one
                cpu_capability=torch.backends.cpu.get_cpu_capability(), seed=seed)

def save_checkpoint(obj, path):
    """Atomic (a temp file of this process's, synced, + rename, synced): a kill, a crash or a power loss mid-write
    leaves the previous checkpoint intact. A full disk or an unwritable folder is an OSError naming the path
    (torch.save raises RuntimeError for some)."""
    try:
        with folders.whole(path) as tmp:  # the data on disk before the name points at it, then the rename
            torch.save(obj, tmp)
    except BaseException as e:  # disk full or Ctrl-C: no partial file is left (folders.whole removes it)
        if isinstance(e, (OSError, RuntimeError)):
            why = getattr(e, "strerror", None) or (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise OSError(f"cannot write {path}: {why}") from None
        raise

def rng_state(device_type):
    """The random states a checkpoint keeps for a resume (set_rng_state): torch's, and CUDA's on a GPU."""
    return {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state() if device_type == "cuda" else None}

def set_rng_state(rng, device_type):
    torch.set_rng_state(rng["torch"])
    if device_type == "cuda" and rng["cuda"] is not None:
        torch.cuda.set_rng_state(rng["cuda"])

class CheckpointError(ValueError):
    """A file that is not a checkpoint this code loads safely; the message is one line naming the file."""

def finished_part(out_dir):
    """What of a run's results out_dir holds (best.pt, evaluations in log.jsonl), in words; "" if none: a run killed
    before its first checkpoint may start afresh."""
    evals = sum("val_loss" in r for r in tracking.read_log(os.path.join(out_dir, "log.jsonl")))
    return ", ".join(["best.pt"] * os.path.isfile(os.path.join(out_dir, "best.pt"))
                     + [f"log.jsonl with {evals} evaluation(s)"] * (evals > 0))

def check_out_dir(out_dir, resuming, resume, overwrite):
    """CheckpointError unless a run may write in out_dir: a new run never replaces an old one unasked (overwrite),
    and resume=True resumes or refuses: results without the ckpt.pt to continue them are never deleted."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise CheckpointError(f"out_dir={out_dir!r} is a file, not a folder")
    old = [f for f in RUN_FILES if os.path.exists(os.path.join(out_dir, f))]
    results = finished_part(out_dir) if old and not (resuming or overwrite) else ""
    if resume and results:
        raise CheckpointError(f"resume=True, but out_dir={out_dir!r} holds a run's results ({results}) and no ckpt.pt "
                              f"to resume from; nothing was deleted: restore its ckpt.pt, choose another out_dir=..., "
                              f"or replace the run with overwrite=True")
    if old and not (resuming or resume or overwrite):
        raise CheckpointError(f"out_dir={out_dir!r} already holds a run ({', '.join(old)}): continue it with "
                              f"resume=True, choose another out_dir=..., or replace it with overwrite=True")

def clear_out_dir(out_dir, resuming, start=None):
    """Before a run writes: a killed write's temp files (no other writer: the folder is locked), a resumed log's cut
    last line (a kill or a full disk mid-write) and its steps past the checkpoint's iter `start` (run again), and,
    unless it resumes, the replaced run's files."""
    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(out_dir):
        if re.search(r"\.tmp(-\d+)?$", f) or (not resuming and f in RUN_FILES):
            os.remove(os.path.join(out_dir, f))
    if resuming:
        tracking.repair_log(os.path.join(out_dir, "log.jsonl"), start)

def read_checkpoint(path, device="cpu", mmap=False, need=()):
    """The dict train.py saved, read with weights_only=True (tensors and plain containers: a file that carries code
    is refused, never run); mmap=True maps the tensors instead of reading them, a cheap check of a file. need: the
    keys a caller needs beyond the model (a resume's optimizer, RNG and data state)."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{path!r} is a directory, expected a checkpoint file" if os.path.isdir(path)
                              else f"checkpoint {path!r} does not exist")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip; all else stops here
        raise CheckpointError(f"{path!r} is not a checkpoint: not a torch.save zip archive ({os.path.getsize(path):,} "
                              "bytes: empty, truncated or another kind of file)")
    if not mmap:  # torch.load never checks the zip's CRCs: a damaged weight would load as a silently other model
        check_crcs(path)
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
    # an older checkpoint lacks the newer model fields: their defaults are its model
    ckpt["model_args"] = {**{f.name: f.default for f in dataclasses.fields(GPTConfig)}, **ckpt["model_args"]}
    if not set(need) <= ckpt.keys():  # e.g. a best.pt copied over ckpt.pt
        raise CheckpointError(f"{path} holds no {' or '.join(k for k in need if k not in ckpt)} state, which a resume "
                              f"needs (a best.pt?): start a new run from its weights with init_from={path}")
    return ckpt

def check_crcs(path):
    """CheckpointError naming the first entry of path whose bytes fail their CRC (a disk or copy error)."""
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError):  # damaged headers: torch.load's error says so, in read_checkpoint's line
        return
    if bad:
        raise CheckpointError(f"checkpoint {path!r} is damaged: entry {bad} fails its CRC check (a disk or copy "
                              f"error); use another checkpoint of the run (best.pt or ckpt.pt) or train it again")

def trained_on(paths, default):
    """The evals' --data when none is given: the prepared dataset the first checkpoint trained on (its config's
    data_dir/dataset) where that folder is here, else default; a task run or an import names none."""
    cfg = (read_checkpoint(paths[0], mmap=True).get("config") or {}) if paths else {}
    folder = data_folder(cfg)
    return folder if folder and not cfg.get("task") and os.path.isdir(folder) else default

def load_checkpoint(path, device="cpu", **overrides):
    """GPT from a checkpoint written by train.py (read_checkpoint); overrides change config fields (e.g. backend)."""
    if overrides.get("backend") == "triton" and torch.device(device).type != "cuda" and not os.environ.get(
            "TRITON_INTERPRET") == "1":  # else kernels.py's RuntimeError at the first forward, a traceback
        raise CheckpointError("--backend triton: the fused Triton kernels need a CUDA GPU; use --backend auto or torch")
    ckpt = read_checkpoint(path, device)
    return model_of(ckpt, path, **overrides).to(device), ckpt

def iter_of(path):
    """The iteration a checkpoint file reached, None where there is none (mmap: its record, not its tensors)."""
    return read_checkpoint(path, mmap=True)["iter_num"] if os.path.isfile(path) else None

def trained(path, iters):
    """path if its checkpoint reached iteration `iters`, else None: train.py checkpoints at every evaluation,
    iteration 0 included, so a run cut short leaves a ckpt.pt that must not pass for done."""
    return path if iter_of(path) == iters else None

def _refusal(args):
    """GPTConfig's error for these args, None where they make a config."""
    try:
        GPTConfig(**args)
    except (TypeError, ValueError) as e:
        return e
    return None

def model_of(ckpt, path, **overrides):
    """The model a checkpoint holds (its task's: RealGPT for reals), its weights loaded; CheckpointError, one line,
    for args or weights this model.py does not take (a checkpoint of another version or branch), or for an override
    (a script's --backend) that its args take and the override does not: that value named, not the checkpoint."""
    bad = overrides and _refusal(ckpt["model_args"]) is None and _refusal({**ckpt["model_args"], **overrides})
    if bad:  # e.g. backend='sdpa' does not run scorer='ssa'; its backends: ...
        raise CheckpointError(f"the model of {path!r}: {bad}")
    try:
        task = (ckpt.get("config") or {}).get("task", "")
        model = build_model(GPTConfig(**{**ckpt["model_args"], **overrides}), task)
        model.load_state_dict(ckpt["model"])
    except (TypeError, ValueError, RuntimeError) as e:
        why = " ".join(l.strip() for l in str(e).splitlines())[:300]  # load_state_dict's message spans lines
        raise CheckpointError(f"{path!r} does not fit this model: {type(e).__name__}: {why}") from None
    return model

class RealGPT(GPT):
    """The GPT with the SSA paper's linear input embedding x W and a scalar head; its loss is MSE or a logistic loss
    on the positions whose target is not NaN."""

    def __init__(self, config, n_in, loss):
        super().__init__(config)  # vocab_size = 1: lm_head is the scalar head
        self.transformer.wte = nn.Linear(n_in, config.n_embd, bias=False)
        nn.init.normal_(self.transformer.wte.weight, mean=0.0, std=0.02)
        self.loss_kind = loss

    def loss(self, logits, targets, reduction="mean"):
        pred, scored = logits.float().squeeze(-1), ~torch.isnan(targets)
        t = torch.where(scored, targets, 0.0)
        per = ((pred - t) ** 2 if self.loss_kind == "mse" else F.binary_cross_entropy_with_logits(
            pred, t, reduction="none")) * scored
        if reduction == "none":
            return per
        return per.sum() / (scored.sum() if reduction == "mean" else 1)

BEST_KEYS = ("model", "model_args", "config", "iter_num", "best_val_loss", "eval", "run_info", "codec", "hf",
             "changed")

def best_of(state):
    """best.pt's content: the weights and their record, not a resume's optimizer, RNG or data order (ckpt.pt
    continues a run), but the splits' sha256 an evaluation compares (data_provenance)."""
    return {**{k: state.get(k) for k in BEST_KEYS}, "data_state": splits_kept(state.get("data_state"))}

def build_model(config, task=""):
    """The model a run of `task` trains: GPT for tokens, RealGPT for reals."""
    t = tasks.TASKS.get(task)
    return RealGPT(config, t.n_in, t.loss) if t and t.n_in else GPT(config)

def check_task(task, vocab_size, ckpt):
    """CheckpointError unless the checkpoint's model reads a run's inputs: the same task (RealGPT for reals, a
    token task's own ids) and vocabulary (an id past the embedding would fail mid-run)."""
    have = (ckpt.get("config") or {}).get("task", task)  # no stored config: the vocabulary decides
    if have != task:
        raise CheckpointError(f"task={task!r} differs from the checkpoint's {have!r}: its model reads only its own "
                              f"task's inputs; use task={have!r} or train from scratch")
    if vocab_size != ckpt["model_args"]["vocab_size"]:
        raise CheckpointError(f"{f'task {task!r} with these fields has' if task else 'this run has'} a vocabulary of "
                              f"{vocab_size} tokens, the checkpoint's model {ckpt['model_args']['vocab_size']}: it "
                              f"reads only its own; keep the checkpoint's task fields or train from scratch")

def saved_config(ckpt):
    """The config a checkpoint's run was written with; a field it predates is the value that run behaved as
    (ADDED_FIELDS), so a resume goes on as it began rather than with a newer default."""
    return {**ADDED_FIELDS, **(ckpt.get("config") or {})}

def loaded_inits(ckpt):
    """The start-value fields (ssmax_s_init, ssa_b_init, fgate_bias_init...) of weights the checkpoint holds: its
    weights load over them, so a new value would not apply."""
    scorer, names = ckpt["model_args"]["scorer"], {k.rsplit(".", 1)[-1] for k in ckpt["model"]}
    inits = [prm.init for prm in SCORERS[scorer].params if prm.init and param_name(scorer, prm) in names]
    return (*inits, *["fgate_bias_init"] * SCORERS[scorer].forget)
