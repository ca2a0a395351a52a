"""What `draftlab bench cost` measures, and the results folder that lets a rerun continue it.

A job is one shape, its settings (chains and trees), batch sizes and measurement knobs. Its cells
are (setting, server, batch): per setting one plain server (the baseline, re-measured beside every
setting) and one speculative server per forced acceptance, 1 .. S + 1 or the job's chosen ones (a
large shape's server takes a minute to start: three acceptances still leave the line's fit a check).
`measurements.csv` gets one row per measured cell, appended and flushed as soon as it is measured;
`plan.json` records each shape's job, so a rerun skips the measured cells and refuses a job whose
shape or settings differ.
Several shapes may share a folder (the published table holds four).
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from draftlab.core.errors import InputError
from draftlab.core.files import atomic_write_json

PLAIN = "plain"  # the server column of a baseline cell
MEASUREMENT_COLUMNS = (
    "shape",
    "gpu",
    "setting",
    "server",
    "batch",
    "acceptance",
    "tok_s",
    "tok_s_min",
    "tok_s_max",
    "windows",
    "window_tok_s",
    "measured_acceptance",
    "completion_tokens",
)


@dataclass(frozen=True)
class Setting:
    """One speculative configuration: a chain (topk 1, S + 1 draft tokens) or a tree."""

    name: str
    steps: int
    topk: int = 1
    draft_tokens: int | None = None

    @property
    def max_acceptance(self) -> int:
        return self.steps + 1

    @property
    def tokens(self) -> int:
        return self.steps + 1 if self.topk == 1 else int(self.draft_tokens)


def parse_settings(text: str) -> list[Setting]:
    """`chain6,chain3,tree3-4-8` -> settings; treeS-K-D is S steps, topk K, D draft tokens."""
    out = []
    for item in [t.strip() for t in text.split(",") if t.strip()]:
        chain, tree = re.fullmatch(r"chain(\d+)", item), re.fullmatch(r"tree(\d+)-(\d+)-(\d+)", item)
        if chain and int(chain.group(1)) >= 1:
            out.append(Setting(item, int(chain.group(1))))
        elif tree and min(map(int, tree.groups())) >= 1:
            s, k, d = map(int, tree.groups())
            if k < 2 or d > k * s + 1:
                raise InputError(f"--settings {item}: a tree needs topk >= 2 and draft tokens <= topk * steps + 1")
            out.append(Setting(item, s, k, d))
        else:
            raise InputError(f"--settings {item!r}: expected chainS (e.g. chain6) or treeS-K-D (e.g. tree3-4-8)")
    if not out or len({s.name for s in out}) != len(out):
        raise InputError(f"--settings {text!r}: give one or more distinct settings")
    return out


@dataclass
class CostJob:
    """Everything that makes one shape's measurements comparable; a rerun must match it."""

    shape: str
    config_digest: str
    gpu: str
    settings: list[Setting]
    batches: list[int]
    windows: int = 3
    max_new_tokens: int = 256
    prompt_len: int = 32
    max_running_requests: int = 64
    server_flags: list[str] = field(default_factory=list)
    weights: str = "files"
    shape_info: dict = field(default_factory=dict)
    acceptances: list[int] | None = None  # forced acceptances measured (None: every one, 1 .. S + 1)
    prompts: str | None = None  # "FILE sha256:..." of the prompt file tokenised (None: random ids)

    def key(self) -> dict:
        d = asdict(self)
        d["settings"] = [asdict(s) for s in self.settings]
        return d

    def forced(self, setting: Setting) -> list[int]:
        """The forced acceptances measured for one setting: the job's within 1 .. S + 1, or all of them."""
        every = range(1, setting.max_acceptance + 1)
        return [t for t in every if self.acceptances is None or t in self.acceptances]

    def servers(self, setting: Setting) -> list[tuple[str, int | None]]:
        """(server, forced acceptance) of one setting: the plain baseline, then each forced acceptance."""
        return [(PLAIN, None)] + [(setting.name, tau) for tau in self.forced(setting)]

    def cells(self) -> list[tuple[Setting, str, int | None, int]]:
        return [(st, srv, tau, b) for st in self.settings for srv, tau in self.servers(st) for b in self.batches]


def cell_key(setting: str, server: str, acceptance, batch) -> tuple:
    return (setting, server, "" if acceptance in (None, "") else str(int(float(acceptance))), str(int(batch)))


class ResultsFolder:
    """OUT/plan.json and OUT/measurements.csv: the job of each shape and its measured cells."""

    def __init__(self, out: str | Path):
        self.out = Path(out)
        self.plan_path = self.out / "plan.json"
        self.csv_path = self.out / "measurements.csv"

    def plans(self) -> dict:
        if not self.plan_path.is_file():
            return {}
        try:
            plans = json.loads(self.plan_path.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"{self.plan_path}: not JSON ({exc}); move it aside or use another --out") from None
        if not isinstance(plans, dict):
            raise InputError(f"{self.plan_path}: expected an object of shapes")
        return plans

    def claim(self, job: CostJob, record: bool = True) -> None:
        """Record the job, or check it against the one recorded for its shape (resume or refuse);
        record False only checks (a dry run)."""
        plans = self.plans()
        old = plans.get(job.shape)
        # a key absent from an older record is that knob's default (None)
        diff = [] if old is None else sorted(k for k in set(old) | set(job.key()) if old.get(k) != job.key().get(k))
        if diff:
            raise InputError(
                f"--out {self.out}: shape {job.shape} was measured with other {', '.join(diff)} "
                f"(recorded {', '.join(f'{k}={old.get(k)!r}' for k in diff[:2])}); use another --out or --name"
            )
        self.out.mkdir(parents=True, exist_ok=True)
        if old is None and record:
            atomic_write_json(self.plan_path, {**plans, job.shape: job.key()}, indent=2)

    def rows(self) -> list[dict]:
        """Every measured cell; a torn last line (a killed run) is dropped, it will be measured again."""
        if not self.csv_path.is_file():
            return []
        with open(self.csv_path, newline="") as fh:
            text = fh.read()
        complete = text if text.endswith("\n") else text[: text.rfind("\n") + 1]
        rows = list(csv.DictReader(complete.splitlines()))
        if rows and list(rows[0]) != list(MEASUREMENT_COLUMNS):
            raise InputError(f"{self.csv_path}: columns {list(rows[0])}, expected {list(MEASUREMENT_COLUMNS)}")
        return rows

    def done(self, shape: str) -> set[tuple]:
        return {
            cell_key(r["setting"], r["server"], r["acceptance"], r["batch"]) for r in self.rows() if r["shape"] == shape
        }

    def append(self, row: dict) -> None:
        """One measured cell, written whole and flushed (a torn tail from a kill is cut first)."""
        self.out.mkdir(parents=True, exist_ok=True)
        new = not self.csv_path.is_file() or self.csv_path.stat().st_size == 0
        if not new:
            data = self.csv_path.read_bytes()
            if not data.endswith(b"\n"):
                self.csv_path.write_bytes(data[: data.rfind(b"\n") + 1])
        with open(self.csv_path, "a", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=MEASUREMENT_COLUMNS, extrasaction="raise")
            if new:
                writer.writeheader()
            writer.writerow({k: row.get(k, "") for k in MEASUREMENT_COLUMNS})
            fh.flush()
