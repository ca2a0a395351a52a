"""The run folder: the interface between the notebooks' stages, with one owner for its layout.

Each stage reads what an earlier stage wrote under `results/<run_id>/` and writes its own files
there. Every path of that layout is named here once, so a stage never spells another's folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["RunFolder"]


@dataclass(frozen=True)
class RunFolder:
    """`RunFolder(path)`: the named places of one run folder (nothing is created by naming it)."""

    root: Path

    def __init__(self, root: str | Path):
        object.__setattr__(self, "root", Path(root))

    # ---- what the runner and every notebook write
    @property
    def settings(self) -> Path:
        """run.json: the run's TARGET and PROFILE, written when a stage finishes."""
        return self.root / "run.json"

    @property
    def params(self) -> Path:
        """params.yaml: every parameter each notebook ran with, the commit and versions."""
        return self.root / "params.yaml"

    @property
    def metrics(self) -> Path:
        """metrics.json: each notebook's figures, written last by each notebook."""
        return self.root / "metrics.json"

    @property
    def figures(self) -> Path:
        return self.root / "figures"

    @property
    def executed(self) -> Path:
        """The executed notebooks of a headless run."""
        return self.root / "executed"

    # ---- data stages (02 blend, 03 regenerate)
    def data(self, stage: str) -> Path:
        """data/<stage>: a data stage's output folder (`blend`, `regen`, ...)."""
        return self.root / "data" / stage

    @property
    def blend(self) -> Path:
        return self.data("blend")

    @property
    def regen(self) -> Path:
        return self.data("regen")

    def split(self, stage: str, split: str) -> Path:
        """A stage's split file, e.g. split("blend", "test") -> data/blend/test.jsonl."""
        return self.data(stage) / f"{split}.jsonl"

    # ---- drafts (04) and their hidden-state cache
    def draft(self, arch: str = "eagle3") -> Path:
        """drafts/<arch>: an exported draft folder (config.json + model.safetensors)."""
        return self.root / "drafts" / arch

    @property
    def hidden(self) -> Path:
        """The offline hidden-state cache shared by the drafts of one run."""
        return self.root / "drafts" / "hidden"

    # ---- SGLang measurements (06, `draftlab bench sglang`)
    @property
    def sglang(self) -> Path:
        return self.root / "sglang"

    @property
    def sglang_study(self) -> Path:
        return self.sglang / "study"

    @property
    def sglang_summary(self) -> Path:
        return self.sglang / "summary.json"
