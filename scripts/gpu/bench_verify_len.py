"""Time one graphed target forward of the reference engine by number of new tokens, dtype and mask.

Why: notebook 06 on the H200 (2026-12-01) measured chain speedups of 1.33x at S = 3-4 and 0.84x at
S = 6-7 in fp32, while bf16 held 1.35x at S = 6. A verify of S + 1 tokens is the only piece whose
shape changes with S, so this times it alone, for each length, fp32 vs bf16 and additive-float vs
bool mask. Weights do not matter for timing: the target is the embedded one's config, randomly
initialised. Usage (GPU): python3 scripts/gpu/bench_verify_len.py CONFIG.json OUT.json
"""
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lib"))
from draftlab import specdec  # noqa: E402
from draftlab.target import Target, avoid_cudnn_attention  # noqa: E402

LENGTHS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 32, 64]
MAX_LEN = 1024
REPLAYS = 50
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a quick eager check of this script


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def time_lengths(target, mask_kind: str) -> dict:
    """Median ms of a graphed TargetRunner.step for each length (prefix of 100 committed slots)."""
    float_mask = specdec.build_mask
    if mask_kind == "bool":
        specdec.build_mask = lambda base, anc, max_len, dtype: float_mask(base, anc, max_len, torch.bool)
    runner = specdec.TargetRunner(target, "aux", MAX_LEN)
    out = {}
    try:
        for n in LENGTHS:
            ids = torch.zeros(1, n, dtype=torch.long, device=DEVICE)
            pos = torch.arange(100, 100 + n, device=DEVICE)[None]
            base = torch.tensor([100], device=DEVICE)
            anc = torch.ones(n, n, dtype=torch.bool, device=DEVICE).tril()
            times = []
            for i in range(REPLAYS + 5):
                sync()
                t0 = time.perf_counter()
                runner.step(ids, pos, base, anc, graph=DEVICE == "cuda")
                sync()
                if i >= 5:
                    times.append((time.perf_counter() - t0) * 1e3)
            out[n] = round(statistics.median(times), 3)
            print(f"  {mask_kind:5s} L={n:3d}: {out[n]:.3f} ms", flush=True)
    finally:
        runner.close()
        specdec.build_mask = float_mask
    return out


def main(config_path: str, out_path: str) -> None:
    avoid_cudnn_attention()  # as load_target does on CUDA
    config = AutoConfig.from_pretrained(Path(config_path).parent)
    results = {"gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "torch": torch.__version__, "replays": REPLAYS,
               "what": "median ms of one graphed target forward (TargetRunner.step) by new tokens"}
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).to(DEVICE).eval()
        target = Target(name="embedded-config", path=Path(config_path).parent, model=model,
                        tokenizer=None, device=DEVICE, dtype=dtype)
        name = str(dtype).removeprefix("torch.")
        print(f"{name} (attention: {model.config._attn_implementation})", flush=True)
        with torch.inference_mode():
            for mask_kind in ("float", "bool"):
                results[f"{name}/{mask_kind}"] = time_lengths(target, mask_kind)
        del model, target
        Path(out_path).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:])
