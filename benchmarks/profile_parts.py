"""Where the time goes, on the GPU, with random weights in the embedded target's shape.

Why: a training step ran ~0.5 s for 16K tokens (25 TFLOP/s, far under the H200), and the
reference engine's cycle jumped from 6.6 ms (S=5) to 9.6 ms (S=6). Timings do not depend on
the weights, so this needs neither the GGUF nor the data: only the target's config.json.

  python3 benchmarks/profile_parts.py CONFIG_JSON OUT_DIR [--parts train,spec,verify]

`verify` times the target's graphed forward alone by number of new tokens (1-64), in fp32 and
bf16, with the engine's additive mask and with a bool one: the fp32 chain's drop at S = 6.

Writes OUT_DIR/profile.json, OUT_DIR/train_rows.jsonl and OUT_DIR/train_profile_<variant>.txt (torch.profiler, one
step at the middle length).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from draftlab.model.capture import default_capture
from draftlab.model.draft import Eagle3Draft, draft_config_for_target
from draftlab.model.target import Target, autocast
from draftlab.train_draft import OBJECTIVE_VARIANTS, Features, TTTObjective, targets_at

DEVICE = "cuda"  # --device cpu: a smoke test of this script with the tiny target's config


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def timed(fn, reps: int = 5, warm: int = 2) -> float:
    """Median seconds of fn() (synchronised), after warm-up calls."""
    for _ in range(warm):
        fn()
    sync()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


class _NoTokens:
    """The engine asks the tokenizer only for the end-of-turn id."""

    def get_vocab(self):
        return {}

    def convert_tokens_to_ids(self, _):
        return None


def random_target(config_json: Path, dtype) -> Target:
    cfg = LlamaConfig(**{k: v for k, v in json.loads(config_json.read_text()).items() if not k.startswith("_")})
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(DEVICE, dtype).eval()
    return Target(
        name="random", path=config_json.parent, model=model, tokenizer=_NoTokens(), device=DEVICE, dtype=dtype
    )


def make_draft(target: Target, vd: int, use_aux: bool) -> Eagle3Draft:
    dcfg = draft_config_for_target(
        target.config, draft_vocab_size=vd, use_aux=use_aux, capture_layers=default_capture(target.num_layers)
    )
    draft = Eagle3Draft(dcfg, target.model.get_input_embeddings())
    draft.set_vocab(torch.arange(vd))
    return draft.to(DEVICE)


def profile_train(
    target: Target, out: Path, lengths=(512, 1024, 2048), tokens=16384, vd=16000, steps=7, variants=("eager",)
) -> list[dict]:
    rows = []
    for length in lengths:
        for variant in variants:
            rows.append(
                profile_train_shape(
                    target, out, length, tokens, vd, steps, variant, profiled=length == lengths[len(lengths) // 2]
                )
            )
            with open(out / "train_rows.jsonl", "a") as fh:  # row by row: a call cut at its limit keeps the rest
                fh.write(json.dumps(rows[-1]) + "\n")
    return rows


def profile_train_shape(
    target: Target, out: Path, length: int, tokens: int, vd: int, steps: int, variant: str, profiled: bool
) -> dict:
    """One batch shape and objective variant: the parts of a step and the whole step, timed."""
    layers = target.capture_layers
    b = tokens // length
    draft = make_draft(target, vd, True)
    objective = TTTObjective(draft, steps, 0.8, **OBJECTIVE_VARIANTS[variant])
    opt = torch.optim.AdamW(draft.parameters(), lr=1e-4)
    ids = torch.randint(0, target.vocab_size, (b, length), device=DEVICE)
    valid = torch.ones(b, length, dtype=torch.bool, device=DEVICE)
    valid[b // 2 :, length * 3 // 4 :] = False  # some right padding
    loss_mask = valid.clone()
    loss_mask[:, : length // 3] = False  # the prompt part
    feats = Features(target, layers, True)
    state = {}

    def features():
        state["f"], state["last"] = feats(None, ids, valid, DEVICE)

    def targets():
        with autocast(DEVICE):
            state["t"] = targets_at(target, state["last"], pred_mask, draft.draft_ids(), draft.t2d)

    pred_mask = torch.nn.functional.pad((loss_mask & valid)[:, 1:], (0, 1)).cpu()

    def fwd_bwd():
        with autocast(DEVICE):
            loss, _ = objective(state["f"], ids, valid, state["t"])
        loss.backward()

    def opt_step():
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 0.5)
        opt.step()
        opt.zero_grad(set_to_none=False)  # zeros, not None: a timed step alone still updates every parameter

    def whole():
        features()
        targets()
        fwd_bwd()
        opt_step()  # noqa: E702

    features()
    targets()  # noqa: E702
    t = time.perf_counter()
    fwd_bwd()  # the first call: a compiled variant compiles here
    sync()
    first_s = time.perf_counter() - t
    row = {
        "variant": variant,
        "first_fwd_bwd_s": first_s,
        "seq_len": length,
        "batch": b,
        "tokens": b * length,
        "features_ms": 1e3 * timed(features),
        "soft_targets_ms": 1e3 * timed(targets),
        "fwd_bwd_ms": 1e3 * timed(fwd_bwd),
        "opt_ms": 1e3 * timed(opt_step),
        "step_ms": 1e3 * timed(whole),
    }
    row["tok_s"] = row["tokens"] / row["step_ms"] * 1e3
    if variant == "eager":
        objective.steps = 1  # how the TTT unroll scales: one step instead of `steps`
        row["fwd_bwd_ttt1_ms"] = 1e3 * timed(fwd_bwd)
        objective.steps = steps
    print(json.dumps(row), flush=True)
    if profiled:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            whole()
            sync()
        key = "cuda_time_total" if DEVICE == "cuda" else "cpu_time_total"
        table = prof.key_averages().table(sort_by=key, row_limit=40)
        (out / f"train_profile_{variant}.txt").write_text(table)
        print(table[:6000], flush=True)
    del draft, objective, opt, state
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return row


def profile_spec(config_json: Path, dtype, max_len=1024) -> list[dict]:
    """Graphed verify step by tokens per step, graphed draft chain by S, and whole cycles."""
    from draftlab.engine import SpecConfig, SpecEngine

    target = random_target(config_json, dtype)
    draft = make_draft(target, 16000, True).to(dtype)
    rows = []
    ctx = torch.inference_mode()
    with ctx:
        for s in range(1, 8):
            eng = SpecEngine(target, draft, SpecConfig(num_steps=s, max_new_tokens=64), max_len=max_len)
            if DEVICE != "cuda":
                eng.use_graphs = False
            eng.capture()
            dev = eng.device
            n = s + 1
            ids = torch.zeros(1, n, dtype=torch.long, device=dev)
            pos = torch.arange(300, 300 + n, device=dev)[None]
            base = torch.tensor([300], device=dev)
            graphs = eng.use_graphs
            verify_ms = 1e3 * timed(
                lambda: eng.runner.step(ids, pos, base, eng._tril(n), graph=graphs), reps=50, warm=5
            )
            one = torch.zeros(1, 1, dtype=torch.long, device=dev)
            greedy_ms = 1e3 * timed(
                lambda: eng.runner.step(one, pos[:, :1], base, eng._tril(1), graph=graphs), reps=50, warm=5
            )
            width = 3 * target.hidden_size
            row = {"dtype": str(dtype).split(".")[-1], "S": s, "verify_ms": verify_ms, "greedy_step_ms": greedy_ms}
            for a in (1, n):
                feats = torch.zeros(1, a, width, dtype=dtype, device=dev)
                row[f"draft_chain_ms_extend{a}"] = 1e3 * timed(
                    lambda: eng.draft_runner.chain(ids[:, :a], feats, base, eng._tril(a), graph=graphs), reps=50, warm=5
                )
            prompt = list(range(100, 400))
            eng.greedy(prompt)
            g = eng.greedy(prompt)
            sp = eng.speculative(prompt)
            row.update(
                greedy_decode_ms_per_token=1e3 * g.decode_s / max(1, len(g.tokens) - 1),
                spec_ms_per_cycle=1e3 * sp.decode_s / max(1, sp.verify_steps),
                spec_accepted_mean=sum(sp.accepted) / max(1, len(sp.accepted)),
            )
            rows.append(row)
            print(json.dumps(row), flush=True)
            eng.close()
            del eng
    return rows


VERIFY_LENGTHS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 32, 64)


def profile_verify(config_json: Path, dtype, max_len=1024) -> dict:
    """Median ms of one graphed TargetRunner.step by new tokens, for each mask kind (100 committed slots)."""
    from draftlab.engine import runners as specdec
    from draftlab.model.target import avoid_cudnn_attention

    if DEVICE == "cuda":
        avoid_cudnn_attention()  # as load_target does, so the engine's kernels are the ones timed
    target = random_target(config_json, dtype)
    name = str(dtype).split(".")[-1]
    float_mask = specdec.build_mask
    out = {}
    with torch.inference_mode():
        for kind in ("float", "bool"):
            if kind == "bool":
                specdec.build_mask = lambda base, anc, length, _dtype: float_mask(base, anc, length, torch.bool)
            runner = specdec.TargetRunner(target, "aux", max_len)
            try:
                row = {}
                for n in VERIFY_LENGTHS:
                    ids = torch.zeros(1, n, dtype=torch.long, device=DEVICE)
                    pos = torch.arange(100, 100 + n, device=DEVICE)[None]
                    base = torch.tensor([100], device=DEVICE)
                    anc = torch.ones(n, n, dtype=torch.bool, device=DEVICE).tril()
                    row[n] = round(
                        1e3 * timed(lambda: runner.step(ids, pos, base, anc, graph=DEVICE == "cuda"), reps=50, warm=5),
                        3,
                    )
                    print(f"  {name} {kind:5s} L={n:3d}: {row[n]:.3f} ms", flush=True)
                out[f"{name}/{kind}"] = row
            finally:
                runner.close()
                specdec.build_mask = float_mask
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config_json", type=Path)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--parts", default="train,spec")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--lengths", default="512,1024,2048")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument(
        "--variants", default="eager", help=f"training objective variants, of {', '.join(OBJECTIVE_VARIANTS)}"
    )
    ap.add_argument("--draft-vocab", type=int, default=16000)
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    args.out_dir.mkdir(parents=True, exist_ok=True)
    result = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "torch": torch.__version__}
    parts = args.parts.split(",")
    dtypes = (torch.float32, torch.bfloat16) if DEVICE == "cuda" else (torch.float32,)
    if "spec" in parts:
        result["spec"] = [row for dt in dtypes for row in profile_spec(args.config_json, dt)]
    if "verify" in parts:
        result["verify_ms"] = {k: v for dt in dtypes for k, v in profile_verify(args.config_json, dt).items()}
    if "train" in parts:
        target = random_target(args.config_json, torch.bfloat16 if DEVICE == "cuda" else torch.float32)
        result["train"] = profile_train(
            target,
            args.out_dir,
            [int(x) for x in args.lengths.split(",")],
            args.tokens,
            args.draft_vocab,
            variants=tuple(args.variants.split(",")),
        )
    (args.out_dir / "profile.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
