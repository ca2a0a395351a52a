"""GPU proof of the SGLang hidden-state capture (docs/sglang-hidden-states.md); JSON results under $OUT.

  embedded  the embedded target's conversations captured through SGLang and computed by transformers
            (fp32 and bf16 on the GPU): per-layer max abs error and cosine, the bf16 baseline that sets
            the tolerance, the capture's tok/s against SGLang's own prefill tok/s on the same tokens
  deepseek  a DeepSeek-V3-shaped model (hidden 7168, 61 layers, the real dense/MoE pattern, few small
            experts, SGLang's dummy random weights, its own DeepSeek model code) captured 21504 wide at
            the ids model.capture computes
  tp        a random-weight Llama of a shape TP can split, captured with --tp-size 1 and N: agreement
            between them and against transformers fp32, tok/s per GPU (issue: several GPUs)

Each writes $OUT/<name>.json. SGLANG_PREFIX: an installed SGLang bundle put first on the server's path
(transformers 5.12.1 there); SGLANG_FLAGS: flags every server gets (default the triton set of
platform-notes.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import datasets
import httpx
import torch

from draftlab.core.records import make_conversation
from draftlab.core.serve import free_port
from draftlab.model.chat_data import tokenize_rows
from draftlab.model.hidden import OfflineHidden, final_feature, target_states
from draftlab.model.target import load_target, load_tokenizer, read_config, resolve_path
from draftlab.sglang.commands import sglang_target_command
from draftlab.sglang.hidden_capture import capture_hidden, capture_plan
from draftlab.sglang.hidden_server import SGLangCapture, server_env_with_draftlab
from draftlab.sglang.install import server_env
from draftlab.sglang.server import SGLangServer

OUT = Path(os.environ.get("OUT", "results/sglang-hidden"))
WORK = Path(os.environ.get("WORK", "/tmp/sglang-hidden"))
FLAGS = os.environ.get(
    "SGLANG_FLAGS",
    "--attention-backend triton --sampling-backend pytorch --grammar-backend none --disable-cuda-graph "
    "--mem-fraction-static 0.6",
)
WORDS = "the a cat dog runs jumps over lazy quick brown fox python code function returns list why how".split()
SLICES = ("low", "mid", "high", "final")


def env():
    prefix = os.environ.get("SGLANG_PREFIX")
    return server_env(prefix, check=False) if prefix else None


def sglang_version() -> str:
    import subprocess
    import sys

    cmd = [sys.executable, "-c", "import sglang; print(sglang.__version__)"]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env())
    return run.stdout.strip() or run.stderr.strip()[-200:]


def conversations(n: int, seed: int = 0) -> list[dict]:
    """Chat conversations of a few turns (no meaning needed: the states of the same tokens are compared)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        messages = []
        for _turn in range(rng.randint(1, 3)):
            messages.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(5, 40))) + "?"})
            messages.append({"role": "assistant", "content": " ".join(rng.choices(WORDS, k=rng.randint(20, 200)))})
        rows.append(make_conversation(messages, "synthetic"))
    return rows


def random_ids(n: int, vocab: int, seed: int = 0) -> datasets.Dataset:
    rng = random.Random(seed)
    rows = [
        {"id": f"r{i}", "input_ids": [rng.randrange(10, vocab) for _ in range(rng.randint(64, 1024))]} for i in range(n)
    ]
    return datasets.Dataset.from_list(rows)


def capture(model_dir, plan, flags: str, ds, out: Path, name: str) -> dict:
    with SGLangCapture(model_dir, plan, flags, out / "sglang.log", env=env(), in_flight=16) as adapter:
        summary = capture_hidden(adapter, ds, out / "store", plan, name, torch.bfloat16)
        summary["command"] = adapter.command
    return summary


def reference(spec: str, ds, layers, dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """transformers' (aux, post-norm final) per conversation, float32 on the CPU."""
    target = load_target(spec, device="cuda", dtype=dtype)
    out = []
    for ids in ds["input_ids"]:
        aux, last, _ = target_states(target, torch.tensor([ids]), None, layers)
        out.append((aux[0].float().cpu(), final_feature(target, last)[0].float().cpu()))
    del target
    torch.cuda.empty_cache()
    return out


def from_store(store: OfflineHidden, ds) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for k, ids in enumerate(ds["input_ids"]):
        aux, last = store.get([k], len(ids))
        out.append((aux[0].float(), last[0].float()))
    return out


def compare(got, ref, hidden: int) -> dict:
    """Per slice (low, mid, high aux layers, final): max abs error, max |ref|, min and mean token cosine."""
    result = {}
    for j, name in enumerate(SLICES):
        cut = (lambda a, f: f) if name == "final" else (lambda a, f, j=j: a[:, j * hidden : (j + 1) * hidden])
        g = torch.cat([cut(*x) for x in got])
        r = torch.cat([cut(*x) for x in ref])
        cos = torch.nn.functional.cosine_similarity(g, r, dim=-1)
        result[name] = {
            "max_abs_err": (g - r).abs().max().item(),
            "max_abs_ref": r.abs().max().item(),
            "min_cosine": cos.min().item(),
            "mean_cosine": cos.mean().item(),
            "tokens": g.shape[0],
        }
    return result


def within(measured: dict, baseline: dict, factor: float, min_cos: float) -> dict:
    """The tolerance (docs): per slice, max abs error at most `factor` x the bf16 baseline's, cosine >= min_cos."""
    ok = {
        s: measured[s]["max_abs_err"] <= factor * baseline[s]["max_abs_err"] and measured[s]["min_cosine"] >= min_cos
        for s in SLICES
    }
    return {"factor": factor, "min_cosine": min_cos, "per_slice": ok, "all": all(ok.values())}


def prefill_tok_s(model_dir, flags: str, ds, log: Path, extra: str = "") -> float:
    """SGLang's own prefill rate on the same tokens: a plain server (no hook, prefix reuse off), max_new_tokens 1."""
    cmd = sglang_target_command(str(model_dir), port=free_port(), extra=tuple((flags + " " + extra).split()) +
                                ("--disable-radix-cache",))  # fmt: skip
    rows = list(ds["input_ids"])
    with SGLangServer(cmd, log, env=server_env_with_draftlab(env()), startup_timeout=1200) as server:
        client = httpx.Client(base_url=server.base_url, timeout=600)

        def one(ids):
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
            client.post("/generate", json=body).raise_for_status()

        one(rows[0])
        t0 = time.time()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(one, rows))
        seconds = time.time() - t0
    return sum(len(r) for r in rows) / seconds


def write(name: str, result: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    result = {"sglang_version": sglang_version(), "gpu": torch.cuda.get_device_name(0), **result}
    (OUT / f"{name}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1)[:4000])


def random_copy(src: Path, folder: Path) -> Path:
    """src's config and tokenizer files with seeded random bf16 weights (made once): the embedded
    target's shape and tokens where its weights are not on the machine."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if (folder / "model.safetensors").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors"):
            (folder / f.name).write_bytes(f.read_bytes())
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.bfloat16)
    model.save_pretrained(folder)
    return folder


def embedded(args) -> None:
    spec, weights = args.model, "real"
    if spec != "embedded" and not any(Path(spec).glob("*.safetensors")):
        spec, weights = str(random_copy(Path(spec), WORK / "target-random")), "random bf16, seed 0"
    model_dir, tokenizer = resolve_path(spec), load_tokenizer(spec)
    rows, _ = tokenize_rows(conversations(args.n), tokenizer, 2048, where="synthetic")
    ds = datasets.Dataset.from_list(rows)
    plan = capture_plan(read_config(spec))
    summary = capture(model_dir, plan, FLAGS, ds, WORK / "embedded", "embedded")
    got = from_store(OfflineHidden(WORK / "embedded" / "store", ds), ds)
    ref32 = reference(spec, ds, plan["layers"], torch.float32)
    ref16 = reference(spec, ds, plan["layers"], torch.bfloat16)
    h = plan["hidden_size"]
    vs32, base = compare(got, ref32, h), compare(ref16, ref32, h)
    prefill = prefill_tok_s(model_dir, FLAGS, ds, WORK / "embedded" / "prefill.log")
    write("embedded", {
        "target": args.model, "weights": weights,
        "conversations": len(ds), "tokens": summary["tokens"], "plan": plan, "sglang_command": summary["command"],
        "sglang_vs_transformers_fp32": vs32, "transformers_bf16_vs_fp32": base,
        "sglang_vs_transformers_bf16": compare(got, ref16, h),
        "tolerance": within(vs32, base, args.factor, args.min_cosine),
        "capture_tok_s": summary["tok_s"], "sglang_prefill_tok_s": prefill,
        "capture_vs_prefill": summary["tok_s"] / prefill,
    })  # fmt: skip


def deepseek_folder(folder: Path, experts: int, moe_width: int) -> dict:
    """config.json of DeepSeek-V3's shape (61 layers, 3 dense, MLA, 7168 wide) with few, narrow experts."""
    config = json.loads(Path("data/configs/deepseek-v3-61layer/config.json").read_text())
    config.update(n_routed_experts=experts, moe_intermediate_size=moe_width, n_group=1, topk_group=1,
                  num_experts_per_tok=2, num_nextn_predict_layers=0)  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return config


def deepseek(args) -> None:
    folder = WORK / "deepseek-v3-shape"
    config = deepseek_folder(folder, args.experts, args.moe_width)
    plan = capture_plan(config)
    ds = random_ids(args.n, config["vocab_size"])
    flags = f"{FLAGS} --load-format dummy --skip-tokenizer-init {args.sglang_args}"
    summary = capture(folder, plan, flags, ds, WORK / "deepseek", "deepseek-v3-shape")
    store = OfflineHidden(WORK / "deepseek" / "store", ds)
    aux, last = store.get([0], len(ds[0]["input_ids"]))
    write("deepseek_shape", {
        "capture_ids": plan["layers"], "config_ids": plan["config_ids"], "eagle3_width": aux.shape[-1],
        "eagle_flag_width": last.shape[-1], "stored_layers": store.layers, "finite": bool(aux.isfinite().all()),
        "experts": args.experts, "moe_intermediate_size": args.moe_width, "tokens": summary["tokens"],
        "capture_tok_s": summary["tok_s"], "sglang_command": summary["command"],
        "note": "SGLang's hook checked that its deepseek_v2 setter chose hidden_states" + str(plan["layers"]),
    })  # fmt: skip


def tp_model(folder: Path, shape: str) -> Path:
    """A seeded random-weight Llama of `shape` (a data/configs folder) in bf16 safetensors, made once."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if (folder / "model.safetensors").is_file() or (folder / "model.safetensors.index.json").is_file():
        return folder
    config = LlamaConfig(**json.loads(Path(f"data/configs/{shape}/config.json").read_text()))
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    load_tokenizer("embedded").save_pretrained(folder)  # transformers' loader wants one; SGLang skips it
    return folder


def tp(args) -> None:
    folder = tp_model(WORK / f"tp-{args.shape}", args.shape)
    config = read_config(str(folder))
    plan = capture_plan(config)
    ds = random_ids(args.n, config["vocab_size"])
    runs, states = {}, {}
    for size in (1, args.tp):
        flags = f"{FLAGS} --skip-tokenizer-init --tp-size {size}"
        runs[size] = capture(folder, plan, flags, ds, WORK / f"tp{size}", f"tp-{args.shape}")
        states[size] = from_store(OfflineHidden(WORK / f"tp{size}" / "store", ds), ds)
    ref32 = reference(str(folder), ds, plan["layers"], torch.float32)
    ref16 = reference(str(folder), ds, plan["layers"], torch.bfloat16)
    h, base = plan["hidden_size"], compare(ref16, ref32, plan["hidden_size"])
    per = {size: compare(states[size], ref32, h) for size in states}
    write(f"tp{args.tp}", {
        "shape": args.shape, "tokens": runs[1]["tokens"], "plan": plan, "transformers_bf16_vs_fp32": base,
        **{f"tp{s}_vs_transformers_fp32": per[s] for s in per},
        f"tp{args.tp}_vs_tp1": compare(states[args.tp], states[1], h),
        **{f"tolerance_tp{s}": within(per[s], base, args.factor, args.min_cosine) for s in per},
        **{f"capture_tok_s_tp{s}": runs[s]["tok_s"] for s in runs},
        **{f"capture_tok_s_per_gpu_tp{s}": runs[s]["tok_s"] / s for s in runs},
    })  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    for name in ("embedded", "deepseek", "tp"):
        p = sub.add_parser(name)
        p.add_argument("--n", type=int, default=64, help="conversations (random sequences for deepseek, tp)")
        p.add_argument("--factor", type=float, default=2.0, help="tolerance: x the bf16 baseline's max abs error")
        p.add_argument("--min-cosine", type=float, default=0.99)
        p.add_argument("--experts", type=int, default=8)
        p.add_argument("--moe-width", type=int, default=512)
        p.add_argument("--sglang-args", default="", help="extra server flags (deepseek)")
        p.add_argument("--tp", type=int, default=2)
        p.add_argument("--shape", default="llama-3.2-1b", help="data/configs folder of the tp model's shape")
        p.add_argument("--model", default="embedded", help="embedded: a target spec, or a folder of config and "
                       "tokenizer files (random weights of that shape when it holds none)")  # fmt: skip
    args = ap.parse_args()
    {"embedded": embedded, "deepseek": deepseek, "tp": tp}[args.what](args)


if __name__ == "__main__":
    main()
