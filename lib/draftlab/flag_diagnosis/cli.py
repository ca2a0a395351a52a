"""`draftlab doctor`: every static check, the runtime reproduction, and the printed report."""

from __future__ import annotations

import argparse
import json
import sys

from draftlab.flag_diagnosis.doctor import diagnose, format_findings, format_probe
from draftlab.flag_diagnosis.inputs import (
    DoctorInputError,
    Finding,
    load_target_info,
    read_draft,
)
from draftlab.flag_diagnosis.probe import probe
from draftlab.sglang.launch import LaunchError

# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def add_doctor_parser(subparsers) -> argparse.ArgumentParser:
    """`draftlab doctor`: static checks of draft x target x flags, and/or a live probe."""
    ap = subparsers.add_parser(
        "doctor",
        help="check a draft, its target and the SGLang flags for silent mismatches (or probe a server)",
        description="Static checks read config.json and safetensors headers only. Exit 0 when nothing is an "
        "error, 1 on any error finding, 2 on unreadable input: a file or field that cannot be read, a "
        "launch command that cannot be a server's, a --probe URL that is malformed or unreachable.",
    )
    ap.add_argument("--draft", help="exported draft folder (config.json + model.safetensors)")
    ap.add_argument(
        "--target", help="target: model folder, config.json, embedded, tiny, or a Hub id (config.json only)"
    )
    ap.add_argument(
        "--launch",
        action="append",
        default=[],
        metavar="CMD",
        help="SGLang launch command (repeat for a baseline and a speculative server)",
    )
    ap.add_argument(
        "--server-info",
        action="append",
        default=[],
        metavar="FILE",
        help="a saved /server_info JSON answer (repeatable)",
    )
    ap.add_argument("--probe", metavar="URL", help="probe a running server: settings, acceptance length, likely causes")
    ap.add_argument("--model", help="with --probe: the model name requests carry (default: from server_info)")
    ap.add_argument("--max-tokens", type=int, default=64, help="with --probe: tokens per request (default 64)")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    ap.add_argument("--quiet", action="store_true", help="hide passed checks")
    ap.set_defaults(func=doctor_main)
    return ap


def doctor_main(args: argparse.Namespace) -> int:
    """Exit 0 when nothing is an error, 1 when something is, 2 when an input cannot be read (a file,
    a field of the wrong type, a launch command, an unreachable or malformed --probe URL): one line on stderr."""
    if not (args.draft or args.launch or args.server_info or args.probe):
        print("draftlab doctor: give --draft/--target, --launch, --server-info or --probe", file=sys.stderr)
        return 2
    try:
        report = None
        if args.probe:
            draft = read_draft(args.draft) if args.draft else None
            target = load_target_info(args.target) if (args.draft and args.target) else None
            report = probe(args.probe, draft=draft, target=target, model=args.model, max_tokens=args.max_tokens)
        result = None
        probed = [report.settings] if report is not None and report.settings is not None else []
        if args.draft or args.launch or args.server_info or probed:
            result = diagnose(args.draft, args.target, args.launch, args.server_info, servers=probed)
    except (DoctorInputError, LaunchError) as exc:
        print(f"draftlab doctor: error: {exc}", file=sys.stderr)
        return 2
    findings = result["findings"] if result else []
    if report is not None and report.collapsed:
        findings = findings + [
            Finding(
                "acceptance",
                "error",
                f"acceptance length {report.acceptance_length:.3f} at {report.url}",
                "the draft contributes almost nothing: every verify step emits about one token",
                report.causes[0].fix if report.causes else "",
                report.url,
            )
        ]
    errors = sum(f.severity == "error" for f in findings)
    warnings = sum(f.severity == "warning" for f in findings)
    if args.json:
        out = {k: v for k, v in (result or {}).items() if not k.startswith("_")}
        out["findings"] = [f.to_dict() for f in findings]
        out["errors"], out["warnings"] = errors, warnings
        out["probe"] = report.to_dict() if report else None
        print(json.dumps(out, indent=2, default=str))
    else:
        if result:
            shape = result["target_shape"]
            head = f"draftlab doctor: draft {result['draft']}" if result["draft"] else "draftlab doctor"
            if shape:
                head += (
                    f" vs target {result['target']} (H={shape['hidden_size']}, {shape['num_layers']} layers, "
                    f"V={shape['vocab_size']})"
                )
            print(head)
            for s in result["servers"]:
                print(f"  server: {s}")
            print(format_findings(findings, verbose=not args.quiet))
        if report is not None:
            print(format_probe(report))
        print(f"{errors} error(s), {warnings} warning(s)")
    return 1 if errors else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="draftlab")
    add_doctor_parser(ap.add_subparsers(dest="command", required=True))
    args = ap.parse_args(["doctor", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
