"""`draftlab bench cost`'s run: every cell of a job measured, one server at a time, resumably.

Per setting the plain server comes first (the baseline, re-measured beside each setting), then one
speculative server per forced acceptance; only one server is up at any time, and it is stopped
whatever happens (a failure, SIGTERM, SIGINT). A server whose cells are all measured is not
started. The first SIGTERM/SIGINT ends the run after the cell being measured (core.stop): the
server is stopped, the measured cells stay in measurements.csv, one line says how to resume; a
second signal stops at once (the server still goes down on the way out).
"""

from __future__ import annotations

import sys
from pathlib import Path

from draftlab.benchmark_acceptance.cost_fit import CycleFit
from draftlab.benchmark_acceptance.cost_plan import PLAIN, CostJob, ResultsFolder, cell_key
from draftlab.benchmark_acceptance.cost_report import (
    PLOT_NAME,
    embedded_check,
    fits_of,
    plot,
    projection,
    table_rows,
    write_summary,
    write_table,
)
from draftlab.core.errors import RunFailure
from draftlab.core.progress import tqdm
from draftlab.core.stop import graceful_stop


def pending(job: CostJob, folder: ResultsFolder) -> list[tuple]:
    """(setting, server, acceptance, [batches]) of the servers with cells still to measure, in run order."""
    done = folder.done(job.shape)
    out = []
    for setting in job.settings:
        for server, tau in job.servers(setting):
            todo = [b for b in job.batches if cell_key(setting.name, server, tau, b) not in done]
            if todo:
                out.append((setting, server, tau, todo))
    return out


def run_job(job: CostJob, folder: ResultsFolder, *, server_for, measure) -> int:
    """Measure every cell not yet in the folder; returns how many were measured now.

    server_for(setting, acceptance): a context manager that starts the server (acceptance None:
    plain) and yields its URL; measure(url, batch): one cell's figures (cost_measure.measure_cell)."""
    folder.claim(job)
    todo = pending(job, folder)
    total = sum(len(b) for *_, b in todo)
    if not total:
        print(f"{job.shape}: all {len(job.cells())} cells already measured in {folder.out}", flush=True)
        return 0
    print(
        f"{job.shape}: {total} of {len(job.cells())} cells to measure on {len(todo)} servers "
        f"(one at a time) -> {folder.csv_path}",
        flush=True,
    )
    measured = 0
    with (
        graceful_stop("rerun the same command to continue") as stop,
        tqdm(total=total, desc=job.shape, unit="cell", dynamic_ncols=True) as bar,
    ):
        for setting, server, tau, batches in todo:
            label = "plain" if tau is None else f"{setting.name} acceptance {tau}"
            bar.set_postfix_str(f"starting {label}")
            with server_for(setting, tau) as url:
                for b in batches:
                    if stop:
                        break
                    bar.set_postfix_str(f"{label} batch {b}")
                    cell = measure(url, b)
                    row = {"shape": job.shape, "gpu": job.gpu, "setting": setting.name, "server": server}
                    folder.append({**row, "batch": b, "acceptance": "" if tau is None else tau, **cell})
                    measured += 1
                    bar.update(1)
                    bar.write(f"  {label:<22} batch {b:>3}: {cell['tok_s']:9.1f} tok/s ({cell['window_tok_s']})")
            if stop:
                stop.stopped(f"bench cost: {measured} cells measured now, {total - measured} left")
    return measured


def finish(folder: ResultsFolder, *, project=None, check=None) -> tuple[list[CycleFit], list[str], dict]:
    """table.csv, summary.json and the plot from everything measured in the folder (all shapes).

    project: (acceptance, setting) for the projection of a measured draft on every shape;
    check: the embedded check's {acceptance, measured, setting, batch, shape}."""
    jobs = folder.plans()
    rows = table_rows(folder.rows())
    write_table(rows, folder.out / "table.csv")
    max_acc = {s["name"]: s["steps"] + 1 for job in jobs.values() for s in job["settings"]}
    fits, errors = fits_of(rows, max_acc)
    extra = {}
    if project:
        extra["projection"] = projection(fits, project[0], project[1])
    if check:
        try:
            extra.update(embedded_check(fits, **check))
        except RunFailure as exc:
            errors.append(str(exc))
    summary = write_summary(folder.out / "summary.json", jobs=jobs, rows=rows, fits=fits, errors=errors, extra=extra)
    if rows:
        import matplotlib.pyplot as plt

        plt.close(plot(rows, fits, folder.out / PLOT_NAME))
    return fits, errors, summary


def print_needed(fits: list[CycleFit], file=None) -> None:
    """The acceptance each setting needs per batch size, as a short text table."""
    file = file or sys.stdout
    print(f"{'shape':<18} {'setting':<10} {'batch':>5} {'cost@1':>7} {'1x':>6} {'1.5x':>6} {'2x':>6}", file=file)
    for f in fits:
        cells = ["  -   " if f.needed(x) is None else f"{f.needed(x):6.2f}" for x in (1.0, 1.5, 2.0)]
        print(f"{f.shape:<18} {f.setting:<10} {f.batch:>5} {f.cycle_cost(1.0):7.2f} {' '.join(cells)}", file=file)


def write_commands(path, lines: list[str]) -> Path:
    """commands.txt: the launch line of every server of the folder's jobs (kept across reruns and shapes)."""
    path = Path(path)
    old = path.read_text().splitlines() if path.is_file() else []
    new = [line for line in lines if line not in old]
    if new:
        with open(path, "a") as fh:
            fh.write("\n".join(new) + "\n")
    return path


__all__ = ["PLAIN", "finish", "pending", "print_needed", "run_job", "write_commands"]
