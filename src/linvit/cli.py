"""`linvit <stage> [-c config.yaml] --out DIR [field.sub=value ...]`

Every stage validates its whole config (types, registry names, input files) before touching data,
and exits with status 2 and one line naming the problem when it cannot run.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from linvit.stages import STAGES


def _resolve(target: str):
    """Import a stage by name: a stage's code is loaded only when it runs, and the workflow's
    code-dependency map (linvit.workflow.deps) follows each stage's own imports."""
    import importlib

    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def stage_config(name: str) -> type:
    """The config dataclass of the CLI stage `name`."""
    return _resolve(STAGES[name].config)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a count of processes (1 or more)")
    return value


def build_parser() -> argparse.ArgumentParser:
    from linvit import __version__

    parser = argparse.ArgumentParser(prog="linvit", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"linvit {__version__}")
    parser.add_argument("--nproc", type=_positive_int, default=1,
                        help="processes (GPUs) for data-parallel training; >1 runs this "
                             "command in that many processes under torch's elastic launcher "
                             "(linvit.runs.launch; run.threads is then shared among them)")
    parser.add_argument("--code-stamp", metavar="FILE",
                        help="refuse to run unless the source files this code stamp lists "
                             "(linvit.workflow.deps.code_stamp) are what it records: the "
                             "workflow's check that its jobs run the code they were planned with")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, stage in STAGES.items():
        p = sub.add_parser(name, help=stage.help, description=stage.help)
        p.add_argument("-c", "--config", help="YAML config (`--print-config` lists its fields)")
        p.add_argument("-o", "--out", help="output folder of this run (required to run)")
        p.add_argument("--print-config", action="store_true",
                       help="print the stage's whole config as YAML that -c accepts, each field "
                            "with a one-line description (its defaults; with -c or field=value "
                            "words, the config they make) and exit")
        p.add_argument("--rerun", action="store_true",
                       help="run even if the folder holds a finished run (it is replaced); an "
                            "unfinished run of the same config resumes (for workflows)")
        if name == "export":            # the Hub's own spelling of it (timm's, huggingface_hub's)
            p.add_argument("--push-to-hub", metavar="ORG/NAME",
                           help="upload the folder to this Hub repository (push_to_hub=ORG/NAME)")
        extra = (f"; a first argument without '=' sets {stage.positional}"
                 if stage.positional else "")
        p.add_argument("overrides", nargs="*", metavar="field=value",
                       help="dotted overrides, e.g. optim.lr=3e-4 model.operator=focused"
                            + extra)
    demo = sub.add_parser("demo", help="the README's end-to-end transfer on Fashion-MNIST")
    demo.add_argument("-o", "--out", default="results/demo")
    demo.add_argument("--operator", default="linear")
    demo.add_argument("overrides", nargs="*", metavar="field=value",
                      help="overrides applied to every stage, e.g. run.threads=2")
    sub.add_parser("list", help="print every registry: operators, sizes, strategies, ...")
    plan = sub.add_parser("plan", help="what a workflow grid costs before it runs: FLOPs, "
                          "device-hours and peak memory per stage and per axis",
                          add_help=False)
    plan.add_argument("options", nargs="*", help="--configfile FILE [--tflops X]; "
                      "`linvit plan --help` lists them")
    return parser


def code_stamp_problem(stamp: str) -> str | None:
    """Why this job must not run the code it finds (None: it is the code the workflow planned
    with; see linvit.workflow.deps.code_stamp)."""
    from linvit.code_digests import digest_mismatches

    try:
        changed = digest_mismatches(Path(stamp).read_text())
    except (OSError, ValueError) as e:
        return f"cannot read the code stamp {stamp} ({e})"
    if changed:
        return (f"the code changed since the workflow planned this job ({', '.join(changed)} "
                f"differ from {stamp})")
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plan"]:        # its own options; the workflow's code, named, not imported
        return _guarded("plan", lambda: _resolve("linvit.workflow.cost:main")(argv[1:]))
    args = build_parser().parse_args(options_first(argv))
    if args.code_stamp and (problem := code_stamp_problem(args.code_stamp)):
        print(f"linvit {args.command}: error: {problem}; run the workflow again", file=sys.stderr)
        return 2
    if args.nproc > 1 and "LOCAL_RANK" not in os.environ:
        from linvit.runs.launch import run_distributed

        return run_distributed(args.nproc, argv)
    return _guarded(args.command, lambda: run_command(args))


def _guarded(command: str, run) -> int:
    """Exit status 2 and one line for bad input, 1 for a run that failed, EXIT_PREEMPTED for one
    stopped by a preemption signal (and requeued under SLURM)."""
    from linvit.errors import LinvitError, RunFailed, RunPreempted

    try:
        return run()
    except RunPreempted as e:
        from linvit.runs.preempt import EXIT_PREEMPTED, requeue

        print(f"linvit {command}: preempted: {_one_line(e)}", file=sys.stderr)
        if "LOCAL_RANK" not in os.environ:      # a worker's launcher requeues (runs.launch)
            requeue()
        return EXIT_PREEMPTED
    except LinvitError as e:
        print(f"linvit {command}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except RunFailed as e:
        print(f"linvit {command}: failed: {_one_line(e)}", file=sys.stderr)
        return 1


def _check_device(cfg) -> None:
    """run.device=cuda needs CUDA here, where the job runs (not in config validation: the
    workflow builds every job's config on a submit host that may have no GPU)."""
    if getattr(getattr(cfg, "run", None), "device", None) == "cuda":
        from linvit.runs.runtime import cuda_wanted

        cuda_wanted("cuda")


def _one_line(error: Exception) -> str:
    return "; ".join(line.strip() for line in str(error).splitlines() if line.strip())


def options_first(argv: list[str]) -> list[str]:
    """A positional stage's arguments with its options before its free words, so that
    `linvit export RUN_DIR -o DIR field=value` parses (argparse takes one run of free words)."""
    at = next((i for i, a in enumerate(argv) if a in STAGES), None)
    if at is None or not STAGES[argv[at]].positional:
        return argv
    options, words, rest = [], [], iter(argv[at + 1:])
    for item in rest:
        if item in ("-o", "--out", "-c", "--config", "--push-to-hub"):
            options += [item, next(rest, "")]
        elif item.startswith("-"):
            options.append(item)
        else:
            words.append(item)
    return [*argv[:at + 1], *options, *words]


def with_positional(stage: str, overrides: list[str]) -> list[str]:
    """`linvit export RUN_DIR ...`: the first argument that is not field=value (a path may hold
    '=' too: the workflow's attn_start=teacher folders) sets the stage's positional field."""
    field = STAGES[stage].positional
    fields = stage_config(stage).__dataclass_fields__
    for i, item in enumerate(overrides):
        if field and item.partition("=")[0].split(".")[0] not in fields:
            return [f"{field}={item}", *overrides[:i], *overrides[i + 1:]]
    return list(overrides)


def run_command(args) -> int:
    from linvit.config import load_config
    from linvit.errors import ConfigError
    from linvit.io import dumps
    from linvit.runs.rundir import check_output_path

    if args.command == "list":
        _resolve("linvit.registries:print_registries")()
        return 0
    if getattr(args, "print_config", False):
        return _print_config(args)
    if args.out is None:
        raise ConfigError(f"-o/--out: the output folder of this {args.command} run is required")
    check_output_path(args.out)
    if args.command == "demo":
        _resolve("linvit.demo:run_demo")(args.out, args.operator, args.overrides)
        return 0
    overrides = with_positional(args.command, args.overrides)
    if getattr(args, "push_to_hub", None):
        overrides.append(f"push_to_hub={args.push_to_hub}")
    cfg = load_config(stage_config(args.command), args.config, overrides, args.command)
    _check_device(cfg)
    metrics = _resolve(STAGES[args.command].entry)(cfg, args.out, replace=args.rerun)
    brief = {k: v for k, v in metrics.items() if isinstance(v, (int, float, str))}
    print(dumps(brief, indent=1))
    return 0


def _print_config(args) -> int:
    from linvit.config import load_config
    from linvit.config_docs import print_config

    cls = stage_config(args.command)
    given = args.config is not None or args.overrides
    instance = load_config(cls, args.config, with_positional(args.command, args.overrides),
                           args.command) if given else None
    print(print_config(args.command, cls, instance), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
