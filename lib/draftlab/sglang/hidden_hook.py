"""The part of the SGLang capture that runs inside SGLang's model workers, and the spool it writes.

SGLang 0.5.17 attaches forward hooks named by `--forward-hooks` (a JSON list of {name,
target_modules, hook_factory, config}) to the loaded model in every TP rank, after CUDA-graph
capture, so they fire on eager forwards only (prefill runs eagerly with
`--disable-prefill-cuda-graph`). draftlab's hook sits on the inner decoder stack (`model`): on
its first forward it asks the served architecture's own `set_eagle3_layers_to_capture` to capture
the config ids an exported draft would carry (SGLang's +1 and DeepSeek rules applied by SGLang),
and from then on the stack returns (final post-norm state, packed aux states) exactly as SGLang's
EAGLE-3 path computes them. The hook writes both, per request chunk, to a spool folder (TP rank 0
only: with plain TP every rank holds the whole residual stream) and hands the model its plain
output back, so the sampler and logits processor see an ordinary forward.

Why the spool is written the way it is: the hook runs on the scheduler's own thread, so whatever it
waits for, every request waits for. It therefore never waits on the GPU or the disk: per batch it
starts one copy of the batch's states into pinned host memory (non-blocking, on the forward's
stream, an event recorded after it), leaves an empty `.pending` marker per request chunk (so the
client, whose answer may arrive before the file, knows a chunk is coming) and queues the batch for
a writer thread. That thread waits for the event and writes each request's rows from the host copy
(safetensors), then replaces the marker by the chunk. The queue is short: when the disk falls
behind, the scheduler waits for it instead of filling host memory.

Only torch and safetensors are imported at module level: the CPU tests drive the hook with
stand-in modules, and SGLang is imported only where a worker needs it.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from pathlib import Path

HOOK_FACTORY = "draftlab.sglang.hidden_hook:capture_hook"
RID_PREFIX = "draftlab-"  # only requests whose id starts so are spooled (not SGLang's warm-up)
ERROR_FILE = "ERROR"  # a worker that cannot capture writes why here; the client stops on it
PENDING = ".pending"  # a chunk queued for the writer thread and not yet in the spool
WRITER_QUEUE = 4  # batches copied to host and waiting for the disk, at most (then the scheduler waits)


def hook_specs(spool_dir, config_ids, layers, hidden_size: int, architectures) -> list[dict]:
    """The `--forward-hooks` value: one hook on the decoder stack `model` of the served model."""
    config = {
        "spool_dir": str(spool_dir),
        "config_ids": [int(i) for i in config_ids],
        "layers": [int(i) for i in layers],
        "hidden_size": int(hidden_size),
        "architectures": list(architectures or []),
    }
    return [{"name": "draftlab-capture", "target_modules": ["model"], "hook_factory": HOOK_FACTORY, "config": config}]


def hook_flags(specs: list[dict]) -> list[str]:
    """Server flags the capture needs beside the user's: the hook, every token computed (no prefix
    reuse), prefill run eagerly (hooks do not fire in a replayed graph)."""
    return ["--forward-hooks", json.dumps(specs), "--disable-radix-cache", "--disable-prefill-cuda-graph"]


def capture_hook(config: dict):
    """The factory SGLang calls once per worker with the spec's config."""
    return CaptureHook(config)


def _forward_batch(args):
    for a in args:
        if hasattr(a, "rids") and hasattr(a, "forward_mode"):
            return a
    return None


def _packed(aux):
    """SGLang models hand aux states as one packed [T, 3H] tensor or a list of [T, H] ones."""
    import torch

    return aux if isinstance(aux, torch.Tensor) else torch.cat(list(aux), dim=-1)


class CaptureHook:
    """forward hook(module, args, output) on the decoder stack; see the module docstring."""

    def __init__(self, config: dict):
        self.spool = Path(config["spool_dir"])
        self.config_ids = list(config["config_ids"])
        self.layers = list(config["layers"])
        self.hidden = int(config["hidden_size"])
        self.architectures = list(config.get("architectures") or [])
        self.armed = False
        self.failed = False
        self.queue: queue.Queue | None = None  # batches for the writer thread, started on the first one

    def __call__(self, module, args, output):
        if not self.armed:
            self.arm(module)
            return None  # this forward ran without capture; nothing of it is spooled
        if not isinstance(output, tuple) or len(output) != 2:
            if not self.failed:
                self.fail(f"the decoder stack returned {type(output).__name__}, not (hidden, aux): capture is off")
            return None
        final, aux = output
        batch = _forward_batch(args)
        if batch is not None and batch.forward_mode.is_extend() and self.is_writer() and not self.failed:
            self.spool_batch(batch, _packed(aux), final)
        return final  # the model goes on as if nothing were captured

    def arm(self, module) -> None:
        """SGLang's own capture setter of the served architecture, then a check of what it chose."""
        self.armed = True
        try:
            set_capture(module, self.architectures, self.config_ids)
        except Exception as exc:  # a worker must not die of the hook: the client reads ERROR and stops
            self.fail(f"cannot turn on SGLang's aux capture: {type(exc).__name__}: {exc}")
            return
        chosen = list(getattr(module, "layers_to_capture", []))
        if chosen != self.layers:
            self.fail(
                f"SGLang captures hidden_states{chosen} for config ids {self.config_ids}; draftlab expected "
                f"hidden_states{self.layers} (model.capture disagrees with this SGLang's rule)"
            )

    def is_writer(self) -> bool:
        try:
            from sglang.srt.distributed import get_tensor_model_parallel_rank
        except ImportError:
            return True
        return get_tensor_model_parallel_rank() == 0

    def spool_batch(self, batch, aux, final) -> None:
        """Queue the batch's draftlab requests for the writer thread; aux [T, 3H], final [T, H] with T the
        batch's tokens, request i its rows offset_i .. offset_i + n_i (SGLang's extend layout)."""
        lens, starts = list(batch.extend_seq_lens_cpu), list(batch.extend_prefix_lens_cpu)
        tokens = sum(lens)
        if tuple(aux.shape) != (tokens, 3 * self.hidden) or tuple(final.shape) != (tokens, self.hidden):
            self.fail(
                f"captured aux {tuple(aux.shape)} and final {tuple(final.shape)} for {tokens} tokens; expected "
                f"[{tokens}, {3 * self.hidden}] and [{tokens}, {self.hidden}] (DP attention or a scattered "
                "layout splits tokens across ranks: not supported)"
            )
            return
        chunks, offset = [], 0
        for rid, n, start in zip(batch.rids, lens, starts):
            if str(rid).startswith(RID_PREFIX):
                chunks.append((str(rid), int(start), offset, int(n)))
            offset += n
        if not chunks:
            return
        self.spool.mkdir(parents=True, exist_ok=True)
        for rid, start, _, _ in chunks:  # before the forward returns, so before the client's answer
            (self.spool / (chunk_name(rid, start) + PENDING)).touch()
        (host_aux, _), (host_final, event) = to_host(aux), to_host(final)  # one stream: the 2nd event covers both
        if self.queue is None:
            self.queue = queue.Queue(WRITER_QUEUE)
            threading.Thread(target=self._writer, name="draftlab-spool", daemon=True).start()
        self.queue.put((host_aux, host_final, event, chunks))

    def _writer(self) -> None:
        """The writer thread: each queued batch's chunks into the spool, in order, then their markers off."""
        while True:
            host_aux, host_final, event, chunks = self.queue.get()
            try:
                if event is not None:
                    event.synchronize()  # the host copy is complete (the GIL is released while waiting)
                for rid, start, offset, n in chunks:
                    write_chunk(self.spool, rid, start, host_aux[offset : offset + n], host_final[offset : offset + n])
                    (self.spool / (chunk_name(rid, start) + PENDING)).unlink(missing_ok=True)
            except Exception as exc:  # the client reads ERROR and stops; the worker serves on
                self.fail(f"cannot write the spool: {type(exc).__name__}: {exc}")

    def fail(self, message: str) -> None:
        self.failed = True
        self.spool.mkdir(parents=True, exist_ok=True)
        (self.spool / ERROR_FILE).write_text(message + "\n")


def set_capture(inner, architectures, config_ids) -> None:
    """Call the served class's `set_eagle3_layers_to_capture` for the decoder stack `inner`.

    SGLang calls the model's `forward` directly, so no hook sees the outer module; the setter only
    reads `pp_group` and `config` and writes `capture_aux_hidden_states` and `model.layers_to_capture`,
    so it runs here on a holder whose `model` is the stack."""
    from types import SimpleNamespace

    from sglang.srt.distributed import get_pp_group
    from sglang.srt.models.registry import ModelRegistry

    cls = ModelRegistry.resolve_model_cls(list(architectures))[0]
    holder = SimpleNamespace(pp_group=get_pp_group(), config=getattr(inner, "config", None), model=inner)
    holder.capture_aux_hidden_states = False
    cls.set_eagle3_layers_to_capture(holder, list(config_ids))


# ---- the spool: one safetensors file per request chunk ------------------------------------------
def chunk_name(rid: str, start: int) -> str:
    return f"{rid}.{start:09d}.safetensors"


def to_host(t):
    """(host tensor, CUDA event or None): a CUDA tensor's copy started into pinned memory on the current
    stream, the event recorded after it (the writer waits on it); a CPU tensor is copied at once, since
    the model may reuse its memory after the hook returns."""
    import torch

    t = t.detach()
    if not t.is_cuda:
        return t.clone(), None
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return host, event


def write_chunk(spool: Path, rid: str, start: int, aux, final) -> Path:
    """Tokens start.. of request rid: aux [n, 3H], final [n, H] (CPU), written whole or not at all."""
    from safetensors.torch import save_file

    spool.mkdir(parents=True, exist_ok=True)
    path = spool / chunk_name(rid, start)
    tmp = path.with_name("." + path.name + ".tmp")
    save_file({"aux": aux.contiguous(), "final": final.contiguous()}, str(tmp))
    os.replace(tmp, path)
    return path


def worker_error(spool: Path) -> str | None:
    path = Path(spool) / ERROR_FILE
    return path.read_text().strip() if path.is_file() else None


def wait_written(spool: Path, rid: str, timeout: float) -> None:
    """Until no chunk of request rid is pending in the worker's writer (or a worker error appears);
    ValueError after `timeout` seconds."""
    deadline, pause, prefix = time.monotonic() + timeout, 0.0005, rid + "."
    while any(e.name.startswith(prefix) and e.name.endswith(PENDING) for e in os.scandir(spool)):
        if worker_error(spool) is not None:
            return
        if time.monotonic() > deadline:
            raise ValueError(f"{rid}: spooled chunks still being written after {timeout:.0f} s")
        time.sleep(pause)
        pause = min(2 * pause, 0.02)


def take_request(spool: Path, rid: str, n_tokens: int, timeout: float = 600.0):
    """(aux [n, 3H], final [n, H]) of a finished request, its chunks joined in order and deleted;
    ValueError when the chunks do not cover tokens 0..n-1 exactly. Waits first for the chunks the
    worker's writer thread still holds (the answer can arrive before them)."""
    import torch
    from safetensors.torch import load_file

    wait_written(Path(spool), rid, timeout)
    paths = sorted(Path(spool).glob(f"{rid}.*.safetensors"))
    aux, final, at = [], [], 0
    for path in paths:
        start = int(path.name[len(rid) + 1 :].split(".")[0])
        if start != at:
            raise ValueError(f"{rid}: spooled chunks start at token {start}, expected {at}")
        part = load_file(str(path))
        aux.append(part["aux"])
        final.append(part["final"])
        at += part["final"].shape[0]
    if at != n_tokens:
        raise ValueError(f"{rid}: {at} tokens spooled of {n_tokens}")
    for path in paths:
        path.unlink()
    if len(paths) == 1:  # one prefill chunk (the usual case): nothing to join
        return aux[0], final[0]
    return torch.cat(aux), torch.cat(final)
