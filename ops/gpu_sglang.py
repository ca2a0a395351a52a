"""The phases of ops/gpu/sglang.sh on the GPU machine: SGLang from the offline bundle,
the blend regenerated through an SGLang server (notebook 03) and the draft trained in the background
(04), then the draft measured in SGLang (`draftlab bench sglang`) and in the engine (the oracle).

    setup      wheels, GGUF, target conversion (gpu_call.ensure_all)
    stash      nothing else (a transfer call: sglang.sh took the cargo chunk and the bundle parts)
    regen      install SGLang, serve the target, notebook 03 through it, side by side on REGEN_SIDE rows
               (gpu_regen), then 04 in the background (setsid: it outlives the call; log DL/train-bg.log)
    after      wait for 04 (exit 3 while it runs), send the draft and the regenerated set back (once),
               then the study (a whole call) and the engine's oracle runs; results packed every call.
               DRAFT=<a published draft>: nothing trained, the held-out split from EVAL_XZ, the
               published oracle rows of ORACLE_FROM reused when DRAFT is the draft that run published
               (its draft/eagle3.sha256), measured anew otherwise. STUDY=<name>: the study in
               RUN/sglang/<name> instead, e.g. server-flag variants beside the default flags
               (STUDY_ARGS='--chain 6 --trees none --variant="no-overlap=--disable-overlap-schedule"').
    notebooks  a published run (PUBLISHED) re-executed with its draft: STAGES_NOTEBOOKS ("00 05 06") as
               step.sh runs them (P<NN> overrides), then packed as step.sh packs (OUT/reference.tar.gz)
    oracle     the oracle gap on SAMPLES prompts: the engine (chain S=6, tree 5x4x8), then a batch-1
               SGLang study of the same settings, in DL/check<SAMPLES>; the gaps in OUT/oracle_check.json.
               One after the other: run at once the engine slowed to ~1 prompt/s (ninth session).
Exit codes: 0 done, 3 call again, 1 failed; regen passes on notebook 03's (2: call again), an unknown
phase is 2. Every stage, study and oracle command is stopped at the call's deadline (less a margin),
and a rerun resumes what is missing.
"""

from __future__ import annotations

import json
import lzma
import os
import re
import shlex
import shutil
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from draftlab.core.process import alive
from draftlab.model.target import sha256_of
from draftlab.sglang.install import server_env
from ops import gpu_call, gpu_pack, gpu_regen, gpu_stages
from ops.gpu_call import Call, until, unxz, written
from ops.gpu_steps import stage_done

DONE, AGAIN, FAILED = 0, 3, 1
PACK_EXCLUDES = ("*.safetensors", "ckpt-*", "tokens", "hidden", "data", "drafts", "*.pt")  # sglang-results.tar.gz
TRAIN_BG = {
    "BUDGET_S": "1500",
    "STAGES": "04",
    "ATTN_CHECK": "0",
    "P04": "-p ARCHS [eagle3] -p SIDE_BY_SIDE false -p EPOCHS 5.0",
}
ORACLE_CHECK = (("chain6", "--steps 6"), ("tree548", "--steps 5 --topk 4 --num-draft-tokens 8"))


@dataclass
class Knobs:
    """sglang.sh's own environment variables (the call's are gpu_call's), defaults as sglang.sh had them."""

    draft: Path  # DRAFT: a published draft instead of RUN/drafts/eagle3
    samples: int  # SAMPLES: batch-1 prompts of the study and the oracle (the published oracle rows: 32)
    eval_xz: Path  # EVAL_XZ: the blend's held-out split, for a published draft
    oracle_from: Path  # ORACLE_FROM: published oracle rows (same draft, prompts and samples)
    published: Path  # PUBLISHED: the run PHASE=notebooks/oracle re-executes
    study_args: list[str]  # STUDY_ARGS: more `bench sglang` options (shell-quoted, e.g. --variant="NAME=FLAGS")
    study_name: str  # STUDY: the study's folder in RUN/sglang ("study"; another name keeps that one apart)
    study_min_s: int  # STUDY_MIN_S: the study starts only with this much of the call left
    oracle_chain: str  # ORACLE_CHAIN: the engine's chain lengths
    regen_side: int  # REGEN_SIDE: rows of the side-by-side (0: none)
    regen_concurrency: int  # REGEN_CONCURRENCY: requests in flight to the regeneration server
    notebooks: str  # STAGES_NOTEBOOKS: the stages PHASE=notebooks runs

    @classmethod
    def from_env(cls, call: Call, env=None) -> "Knobs":
        env = os.environ if env is None else env

        def get(name: str, default) -> str:
            return env.get(name) or str(default)

        return cls(
            draft=Path(get("DRAFT", call.run / "drafts/eagle3")),
            samples=int(get("SAMPLES", 32)),
            eval_xz=Path(get("EVAL_XZ", "results/reference/data/blend/test.jsonl.xz")),
            oracle_from=Path(get("ORACLE_FROM", "results/reference/sglang")),
            published=Path(get("PUBLISHED", "results/reference")),
            study_args=shlex.split(get("STUDY_ARGS", "")),
            study_name=get("STUDY", "study"),
            study_min_s=int(get("STUDY_MIN_S", 330)),
            oracle_chain=get("ORACLE_CHAIN", "1,3,6"),
            regen_side=int(get("REGEN_SIDE", 4096)),
            regen_concurrency=int(get("REGEN_CONCURRENCY", 1024)),
            notebooks=get("STAGES_NOTEBOOKS", "00 05 06"),
        )

    def oracle_specs(self) -> list[tuple[str, str]]:
        """The engine's oracle runs beside the study: (name, `bench specdec` options)."""
        return [
            ("chain", f"--steps {self.oracle_chain}"),
            ("tree548", "--steps 5 --topk 4 --num-draft-tokens 8"),
            ("tree6816", "--steps 6 --topk 8 --num-draft-tokens 16"),
            ("wrongflag", "--steps 6 --mode EAGLE"),
        ]


def sglang_dir(call: Call) -> Path:
    return call.run / "sglang"


# ---- set-up ----------------------------------------------------------------------------------------
def install_sglang(call: Call) -> bool:
    """SGLang from the staged bundle parts into PREFIX (a no-op once installed); its version in RUN/sglang."""
    install = [
        call.python,
        "-m",
        "draftlab.sglang.install",
        "install",
        "--stage",
        str(call.dl / "sglang-parts"),
        "--prefix",
        str(call.sglang_prefix),
    ]
    if subprocess.run(install).returncode != 0:
        return False
    sglang_dir(call).mkdir(parents=True, exist_ok=True)
    version = subprocess.run(
        [call.python, "-c", "import sglang, transformers, sgl_kernel; print(sglang.__version__)"],
        env=server_env(call.sglang_prefix),
        stdout=subprocess.PIPE,
        text=True,
    )
    if version.returncode != 0:
        return False
    (sglang_dir(call) / "version.txt").write_text(version.stdout)
    call.say(f"SGLang {version.stdout.strip()} installed in {call.sglang_prefix}")
    return True


def publish_run(call: Call, knobs: Knobs) -> bool:
    """PHASE=notebooks/oracle: the published run (its splits unpacked) and its draft as RUN, once while warm."""
    if (call.run / ".published").is_file():
        return True
    shutil.rmtree(call.run, ignore_errors=True)
    try:
        shutil.copytree(call.repo / knobs.published, call.run, symlinks=True)
        for xz in call.run.glob("data/*/*.jsonl.xz"):  # the run's splits travel compressed
            unxz(xz, xz.with_suffix(""))
        shutil.copytree(knobs.draft, call.run / "drafts/eagle3", dirs_exist_ok=True)
    except (OSError, lzma.LZMAError) as exc:
        call.say(f"FAILED: publishing {knobs.published}: {exc}")
        return False
    (call.run / ".published").touch()
    size = sum(f.stat().st_size for f in (call.run / "drafts/eagle3").rglob("*") if f.is_file())
    call.say(
        f"published run {knobs.published} in {call.run}: {' '.join(sorted(p.name for p in call.run.iterdir()))}"
        f"; draft {gpu_pack.human(size)}"
    )
    return True


def measurement_only(call: Call, knobs: Knobs) -> bool:
    """PHASE=after with a published draft: the set-up, the held-out split, the published oracle rows."""
    if not gpu_call.ensure_all(call):
        return False
    test = call.run / "data/blend/test.jsonl"
    if not (test.is_file() and test.stat().st_size):
        test.parent.mkdir(parents=True, exist_ok=True)
        try:
            unxz(call.repo / knobs.eval_xz, test)
        except (OSError, lzma.LZMAError) as exc:
            call.say(f"FAILED: {knobs.eval_xz}: {exc}")
            return False
    published = (call.repo / knobs.oracle_from).parent  # ORACLE_FROM is RUN/sglang of a published run
    rows = sorted((call.repo / knobs.oracle_from).glob("oracle_*.json"))
    if rows and not is_published_draft(knobs.draft, published):
        call.say(f"oracle: {knobs.oracle_from}'s rows measured another draft than {knobs.draft}: measured anew")
        return True
    sglang_dir(call).mkdir(parents=True, exist_ok=True)
    for f in rows:
        if not (sglang_dir(call) / f.name).exists():
            shutil.copyfile(f, sglang_dir(call) / f.name)
    return True


def is_published_draft(draft: Path, run: Path) -> bool:
    """Whether `draft`'s weights are the ones `run` published (RUN/draft/eagle3.sha256): the engine's oracle
    rows of one draft must not stand beside SGLang's figures of another."""
    listed = run / "draft/eagle3.sha256"
    if not (listed.is_file() and (draft / "model.safetensors").is_file()):
        return False
    digests = {name: digest for digest, name in (line.split() for line in listed.read_text().splitlines() if line)}
    return digests.get("model.safetensors") == sha256_of(draft / "model.safetensors")


# ---- 04 in the background ----------------------------------------------------------------------------
def _running(pid_file: Path) -> bool:
    try:
        return alive(int(pid_file.read_text()))
    except (OSError, ValueError):
        return False


def train_in_background(call: Call) -> int:
    """Notebook 04 (eagle3 only, 5 epochs) as step.sh in a session of its own: it outlives this call,
    and later calls wait for it (wait_training)."""
    pid_file = call.dl / "train-bg.pid"
    if _running(pid_file) or stage_done(call.run, "04"):
        return 0
    log = call.dl / "train-bg.log"
    call.say(f"04 in the background (setsid): log {log}")
    env = {**os.environ, "OUT": str(call.dl / "train-bg-out"), **TRAIN_BG}
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            ["bash", "ops/gpu/step.sh"],
            cwd=call.repo,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    pid_file.write_text(f"{proc.pid}\n")
    call.say(f"04 running as pid {proc.pid}")
    return 0


def wait_training(call: Call, poll: float = 10.0) -> int:
    """DONE when 04 is done; AGAIN when it still runs at the deadline; FAILED when it stopped undone."""
    while not stage_done(call.run, "04"):
        if not _running(call.dl / "train-bg.pid"):
            call.say("FAILED: 04 is not running and not done")
            log = call.dl / "train-bg.log"
            print("\n".join(log.read_text(errors="replace").splitlines()[-40:]) if log.is_file() else "", flush=True)
            return FAILED
        if call.left() < 30:
            log = call.run / "train/eagle3/train.log"
            steps = re.findall(r"step [0-9]*", log.read_text(errors="replace")) if log.is_file() else []
            call.say(f"04 still training: {steps[-1] if steps else ''}")
            return AGAIN
        time.sleep(poll)
    m04 = json.loads((call.run / "metrics.json").read_text()).get("04_train_draft", {})
    call.say(f"04 done: { {k: v for k, v in m04.items() if not isinstance(v, (dict, list))} }")
    return DONE


# ---- the study and the oracle ------------------------------------------------------------------------
def study_missing(study: Path) -> list[str]:
    """Labels of the study's plan not measured (or failed) yet; ["no plan"] before it has one."""
    if not (study / "plan.json").is_file():
        return ["no plan"]

    def labels(name: str) -> set:
        try:
            return {json.loads(line)["label"] for line in open(study / name) if line.strip()}
        except OSError:
            return set()

    seen = labels("windows.jsonl") | labels("failures.jsonl")
    plan = json.loads((study / "plan.json").read_text())
    return sorted(e["label"].replace(" ", "_") for e in plan["entries"] if e["label"] not in seen)


def bench_sglang(call: Call, knobs: Knobs, out: Path, *args) -> int:
    """`draftlab bench sglang` on SAMPLES held-out prompts, stopped 20 s before the deadline."""
    argv = call.cli(
        "bench",
        "sglang",
        "--model-path",
        call.model_dir,
        "--draft",
        knobs.draft,
        "--eval-set",
        call.run / "data/blend/test.jsonl",
        "--samples",
        knobs.samples,
        "--max-new-tokens",
        128,
        "--prefix",
        call.sglang_prefix,
        "--python",
        call.python,
        *args,
        "--out",
        out,
    )
    return until(argv, call.deadline - 60, quiet=True)  # SIGTERM: it keeps the windows measured


def specdec(call: Call, knobs: Knobs, out: Path, options: str, **popen_kwargs) -> int:
    """One engine oracle run on the same prompt ids (same eval file, same first SAMPLES), stopped 30 s
    before the deadline."""
    argv = call.cli(
        "bench",
        "specdec",
        "--target",
        "embedded",
        "--draft",
        knobs.draft,
        "--device",
        "cuda",
        "--dtype",
        "bfloat16",
        "--eval-set",
        call.run / "data/blend/test.jsonl",
        "--samples",
        knobs.samples,
        "--max-new-tokens",
        128,
        "--out",
        out,
        *options.split(),
    )
    return until(argv, call.deadline - 30, **popen_kwargs)


def oracle(call: Call, knobs: Knobs) -> None:
    """The engine's oracle runs not done yet, each while 90 s are left."""
    sg = sglang_dir(call)
    for name, options in knobs.oracle_specs():
        final = sg / f"oracle_{name}.json"
        if written(final):
            continue
        if call.left() < 90:
            call.say(f"oracle {name}: left for the next call ({call.left()} s left)")
            return
        tmp = final.with_name(final.name + ".tmp")
        specdec(call, knobs, tmp, options, quiet=True)
        if written(tmp):
            tmp.replace(final)


def oracle_done(call: Call, knobs: Knobs) -> bool:
    return all(written(sglang_dir(call) / f"oracle_{name}.json") for name, _ in knobs.oracle_specs())


def pack_results(call: Call) -> None:
    """This run's results so far (no weights, no data): OUT/sglang-results.tar.gz, small, every call."""
    out = call.out / "sglang-results.tar.gz"
    gpu_pack.tar_gz_without(call.run, call.run_id, out, PACK_EXCLUDES)
    call.say(f"packed {gpu_pack.human(out.stat().st_size)}")


def send_back_once(call: Call) -> None:
    """The trained draft and the regenerated set: what a later session needs (never trained again)."""
    if (call.dl / "sent-back").is_file():
        return
    gpu_pack.save_draft(call, "eagle3")
    for split in ("train", "val"):
        gpu_pack.xz_copy(call.run / f"data/regen/{split}.jsonl", call.out / f"regen-{split}.jsonl.xz")
    (call.dl / "sent-back").touch()
    call.say(f"sent back: {' '.join(sorted(p.name for p in call.out.iterdir()))}")


def oracle_check(call: Call, knobs: Knobs) -> int:
    """PHASE=oracle: engine, then SGLang, acceptance on the same SAMPLES prompt ids; the gaps in OUT."""
    chk = call.dl / f"check{knobs.samples}"
    (chk / "sglang").mkdir(parents=True, exist_ok=True)
    for name, options in ORACLE_CHECK:
        if written(chk / "sglang" / f"oracle_{name}.json"):
            continue
        with open(chk / f"engine_{name}.log", "wb") as log:
            rc = specdec(
                call, knobs, chk / "sglang" / f"oracle_{name}.json", options, stdout=log, stderr=subprocess.STDOUT
            )
        call.say(f"oracle check: engine {name} exit {rc}")
    settings = "--chain 6 --trees 5x4x8 --concurrency 1 --no-wrong-flag --repeats 1 --warmup 0"
    rc = bench_sglang(call, knobs, chk / "sglang/study", *settings.split())
    call.say(f"oracle check: SGLang study exit {rc}")
    subprocess.run(
        [
            call.python,
            "-m",
            "draftlab.benchmark_acceptance.sglang_report",
            "gaps",
            str(chk),
            str(knobs.samples),
            str(call.out / "oracle_check.json"),
        ]
    )
    gpu_pack.tar_gz_without(chk, chk.name, call.out / "oracle-check.tar.gz", ("*.safetensors",))
    return 0


# ---- the phases ----------------------------------------------------------------------------------------
def regen(call: Call, knobs: Knobs) -> int:
    if not (gpu_call.ensure_all(call) and install_sglang(call)):
        return FAILED
    server = gpu_regen.target_server(call, sglang_dir(call) / "regen-server.log")
    if not gpu_regen.started(call, server):
        return FAILED
    try:
        call.stages = ["03"]
        call.overrides["03"] = [
            "-p",
            "BACKEND",
            "server",
            "-p",
            "BASE_URLS",
            json.dumps([server.base_url]),
            "-p",
            "SERVED_MODEL",
            str(call.model_dir),
            "-p",
            "CONCURRENCY",
            str(knobs.regen_concurrency),
            "-p",
            "REQUEST_TIMEOUT",
            "600.0",
        ]
        rc, _ = gpu_stages.run_pending(call)
        if rc == 0 and knobs.regen_side > 0:
            gpu_regen.side_by_side(call, "sglang", knobs.regen_side, server.base_url, knobs.regen_concurrency)
    finally:
        server.stop()
    if rc != 0:
        return rc
    if knobs.regen_side > 0:
        gpu_regen.side_by_side(call, "batch", knobs.regen_side)
    return train_in_background(call)


def after(call: Call, knobs: Knobs) -> int:
    """Whatever is still to do, in priority order, with the time this call has left."""
    if knobs.draft == call.run / "drafts/eagle3":  # this run's own training
        rc = wait_training(call)
        if rc != DONE:
            return rc
        send_back_once(call)
    elif not measurement_only(call, knobs):  # a published draft: a measurement-only session
        return FAILED
    if not (knobs.draft / "model.safetensors").is_file():
        call.say(f"FAILED: no draft at {knobs.draft}")
        return FAILED
    if not install_sglang(call):
        return FAILED
    study = sglang_dir(call) / knobs.study_name
    if not written(study / "summary.csv") or study_missing(study):
        if call.left() < knobs.study_min_s:
            call.say(f"study needs a fresh call ({call.left()} s left)")
            pack_results(call)
            return AGAIN
        call.say(f"study: exit {bench_sglang(call, knobs, study, *knobs.study_args)}")
    oracle(call, knobs)
    subprocess.run(call.cli("bench", "sglang", "--summary-only", "--out", study))  # RUN/sglang/summary.json
    pack_results(call)
    if not study_missing(study) and oracle_done(call, knobs):
        call.say("DONE")
        return DONE
    call.say("NOT DONE YET: PHASE=after again")
    return AGAIN


def notebooks(call: Call, knobs: Knobs) -> int:
    if not (publish_run(call, knobs) and gpu_call.ensure_all(call)):
        return FAILED
    call.stages = knobs.notebooks.split()
    rc, _ = gpu_stages.run_pending(call)
    gpu_pack.report(call)
    # what ran, whatever pack_reference makes of it (it rebuilds summary.json and README.md)
    with tarfile.open(call.out / "notebooks.tar.gz", "w:gz") as tar:
        for name in ("executed", "figures", "metrics.json", "params.yaml", "params.d", "run.json"):
            if (call.run / name).exists():
                tar.add(call.run / name, arcname=name, filter=lambda i: None if i.name.endswith(".safetensors") else i)
    if rc == gpu_stages.DONE:
        return gpu_pack.pack_reference(call)
    if rc == gpu_stages.AGAIN:
        call.say("NOT DONE YET: PHASE=notebooks again")
        return AGAIN
    return FAILED


def run_phase(call: Call, phase: str, knobs: Knobs | None = None) -> int:
    knobs = knobs or Knobs.from_env(call)
    sglang_dir(call).mkdir(parents=True, exist_ok=True)
    if phase == "setup":
        return DONE if gpu_call.ensure_all(call) else FAILED
    if phase == "stash":
        return DONE
    if phase == "oracle":
        if not (publish_run(call, knobs) and gpu_call.ensure_all(call) and install_sglang(call)):
            return FAILED
        return oracle_check(call, knobs)
    phases = {"regen": regen, "after": after, "notebooks": notebooks}
    if phase not in phases:
        call.say(f"unknown PHASE {phase}")
        return 2
    return phases[phase](call, knobs)
