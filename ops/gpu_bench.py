"""The GPU call's extra benchmarks, each once per run: RUN/bench/<name>.json.

    generate_sweep             batch backend output tok/s by batch size (SWEEP_SIZES, SWEEP_NEW tokens)
    generate_cudnn_on / _off   the same prompts with cuDNN's attention kernel on, then off (ATTN_SIZES)
    generate_static            the same with a static KV cache (STATIC_SIZES)
    train_offline              offline hidden states: precompute time, shard bytes, train tok/s
    train_shapes               training tok/s by batch-length rounding and attention kernel (SHAPE_VARIANTS)
Each command is bounded by its own timeout (as timeout(1): exit 124) and stopped with its children.
And trace_setup (ops/gpu/trace_train_setup.sh): where training's set-up goes, OUT/setup_<arch>.txt.
"""

from __future__ import annotations

import lzma
import os
import shutil
import subprocess
import threading
import time
from datetime import datetime, timezone

from ops import gpu_call
from ops.gpu_call import Call, until, unxz, written
from ops.gpu_steps import merge_json, offline_summary, stage_done

PROGRESS_WORDS = ("it/s", "step/s", "conv/s")  # progress lines left out of the log


def _knob(name: str, default: str) -> str:
    return os.environ.get(name) or default


def bounded(argv: list[str], seconds: float, **popen_kwargs) -> int:
    """argv stopped after `seconds` with its descendants: its exit code, 124 when stopped."""
    return until(argv, time.time() + seconds, **popen_kwargs)


def bench_done(call: Call, name: str) -> bool:
    return written(call.run / "bench" / f"{name}.json")


def bench_generate(call: Call, name: str, cache: str, sizes: str, env: dict | None = None) -> int:
    """Batch backend output tok/s by batch size, on the blend's train split."""
    if bench_done(call, name):
        return 0
    blend = call.run / "data/blend/train.jsonl"
    if not blend.is_file():
        call.say(f"{name}: no blend yet, skipped")
        return 0
    (call.run / "bench").mkdir(parents=True, exist_ok=True)
    new = _knob("SWEEP_NEW", "64")
    call.say(f"bench: {name}, {cache} cache, batch sizes {sizes} x {new} new tokens")
    out = call.run / "bench" / f"{name}.json"
    tmp = out.with_name(out.name + ".tmp")
    rc = bounded(
        [
            call.python,
            "-m",
            "draftlab.cli",
            "bench",
            "generate",
            str(blend),
            "--device",
            "cuda",
            "--cache",
            cache,
            "--batch-sizes",
            sizes,
            "--new-tokens",
            new,
            "--json",
            str(tmp),
        ],
        float(_knob("SWEEP_TIMEOUT", "150")),
        env={**os.environ, **(env or {})},
    )
    if rc == 0:
        tmp.replace(out)
    call.say(f"bench: {name} exit {rc}")
    return rc


def bench_generate_sweep(call: Call) -> int:  # before 03, while the GPU has nothing else to do
    return bench_generate(call, "generate_sweep", "dynamic", _knob("SWEEP_SIZES", "1024,2048,4096,8192"))


def bench_generate_attention(call: Call) -> int:
    """cuDNN's attention kernel on, then off (draftlab's default), on the same prompts."""
    sizes = _knob("ATTN_SIZES", "1,256,4096")
    bench_generate(call, "generate_cudnn_on", "dynamic", sizes, env={"DRAFTLAB_CUDNN_SDPA": "1"})
    return bench_generate(call, "generate_cudnn_off", "dynamic", sizes)


def bench_generate_static(call: Call) -> int:  # a static KV cache (transformers may compile the step)
    if call.left() <= 200:
        call.say("static-cache sweep: not enough time left, skipped")
        return 0
    return bench_generate(call, "generate_static", "static", _knob("STATIC_SIZES", "1024,4096"))


def bench_train_offline(call: Call) -> int:
    """Offline hidden states on the regenerated set, OFFLINE_SAMPLES conversations, OFFLINE_STEPS steps."""
    if bench_done(call, "train_offline"):
        return 0
    regen = call.run / "data/regen/train.jsonl"
    if not regen.is_file() or call.left() <= 150:
        call.say("offline-hidden bench skipped")
        return 0
    d = call.dl / "bench-offline"
    shutil.rmtree(d, ignore_errors=True)
    (call.run / "bench").mkdir(parents=True, exist_ok=True)
    samples, steps = _knob("OFFLINE_SAMPLES", "2000"), _knob("OFFLINE_STEPS", "40")
    call.say(f"bench: offline hidden states, {samples} conversations, {steps} steps")
    rc = bounded(
        [
            call.python,
            "-m",
            "draftlab.cli",
            "train",
            "--train-file",
            str(regen),
            "--out-dir",
            str(d / "eagle3"),
            "--target",
            "embedded",
            "--device",
            "cuda",
            "--hidden",
            "offline",
            "--max-train-samples",
            samples,
            "--draft-vocab-size",
            "16000",
            "--ttt-steps",
            "7",
            "--max-len",
            "2048",
            "--epochs",
            "1",
            "--batch-tokens",
            "16384",
            "--max-batch",
            "64",
            "--lr",
            "5e-4",
            "--eval-every",
            "100000",
            "--save-every",
            "100000",
            "--log-every",
            "10",
            "--stop-after",
            steps,
        ],
        140,
    )
    if rc == 0:
        offline_summary(d, call.run / "bench/train_offline.json")
    call.say(f"bench: offline exit {rc}")
    return rc


def bench_train_shapes(call: Call) -> int:
    """Training tok/s by batch-length rounding and attention kernel, random weights (.device/bench)."""
    if bench_done(call, "train_shapes"):
        return 0
    carried = call.repo / ".device/bench"
    if not (carried / "config.json").is_file():
        call.say("train-shapes bench: .device/bench not carried, skipped")
        return 0
    b = call.dl / "bench-shapes"
    b.mkdir(parents=True, exist_ok=True)
    (call.run / "bench").mkdir(parents=True, exist_ok=True)
    try:
        for f in [*carried.glob("*.json"), *carried.glob("*.jinja")]:
            shutil.copyfile(f, b / f.name)
        unxz(carried / "tokenizer.json.xz", b / "tokenizer.json")
        unxz(carried / "train.jsonl.xz", b / "train.jsonl")
    except (OSError, lzma.LZMAError) as exc:
        call.say(f"train-shapes bench: {exc}")
        return 0
    for variant in _knob("SHAPE_VARIANTS", "1:cudnn 64:cudnn 1:auto 64:auto").split():
        pad, attention = variant.split(":")[0], variant.split(":")[-1]
        log = b / f"pad{pad}_{attention}.log"
        with open(log, "wb") as f:
            bounded(
                [
                    call.python,
                    "benchmarks/bench_train_shapes.py",
                    str(b),
                    pad,
                    _knob("SHAPE_STEPS", "50"),
                    str(b / f"pad{pad}_{attention}.json"),
                    "--attention",
                    attention,
                ],
                150,
                stdout=f,
                stderr=subprocess.STDOUT,
            )
        for line in log.read_text(errors="replace").splitlines():
            if not any(w in line for w in PROGRESS_WORDS):
                print(line, flush=True)
    merge_json(call.run / "bench/train_shapes.json", sorted(b.glob("pad*.json")))
    return 0


def benches_before(call: Call) -> None:
    """BENCHES=1, before the stages: the generation sweep (until 03 is done) and the training shapes."""
    if not stage_done(call.run, "03"):
        bench_generate_sweep(call)
    bench_train_shapes(call)


BENCHES = {
    "sweep": bench_generate_sweep,
    "attention": bench_generate_attention,
    "static": bench_generate_static,
    "offline": bench_train_offline,
    "shapes": bench_train_shapes,
}


TRACE_ARCHS = ("eagle3", "eagle1")  # side by side, as notebook 04 trains them


def sample_top(path, every: float, stop: threading.Event) -> None:
    """`top`'s first 20 lines, stamped, appended to `path` every `every` s until `stop` is set."""
    while not stop.wait(every):
        try:
            top = subprocess.run(["top", "-bn1"], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.TimeoutExpired) as exc:
            top = f"top: {exc}\n"
        with open(path, "a") as f:
            f.write(f"{datetime.now(timezone.utc):%H:%M:%S}\n{''.join(top.splitlines(True)[:20])}")


def trace_setup(call: Call, limit: float = 400, top_every: float = 30.0, setup=gpu_call.ensure_all) -> int:
    """benchmarks/trace_train_setup.py for both archs at once, each stopped after `limit` s (or at the
    deadline), with `top` sampled meanwhile: OUT/setup_<arch>.txt and .log, OUT/top.log; their set-up lines."""
    if not setup(call):
        call.say("FAILED: set-up")
        return 1
    call.say(f"{os.cpu_count()} CPUs, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    stop = threading.Event()
    sampler = threading.Thread(target=sample_top, args=(call.out / "top.log", top_every, stop), daemon=True)
    sampler.start()
    end, rcs = min(time.time() + limit, call.deadline), {}

    def trace(arch: str) -> None:
        with open(call.out / f"setup_{arch}.log", "wb") as log:
            rcs[arch] = until(
                [call.python, "benchmarks/trace_train_setup.py", call.run, arch, call.out / f"setup_{arch}.txt"],
                end,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=call.repo,
            )

    traces = [threading.Thread(target=trace, args=(arch,)) for arch in TRACE_ARCHS]
    for t in traces:
        t.start()
    for t in traces:
        t.join()
    stop.set()
    sampler.join()
    for arch in TRACE_ARCHS:
        lines = (call.out / f"setup_{arch}.log").read_text(errors="replace").splitlines()
        print("".join(f"{line}\n" for line in lines if "set-up" in line), end="", flush=True)
        call.say(f"{arch}: exit {rcs.get(arch)}")
    call.say("done")
    return 0
