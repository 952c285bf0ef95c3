"""The ``petl-nas`` command line: ``count`` and ``presets`` (search, train, export, dashboard follow).

Errors print one line, ``petl-nas: error: ...``, and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from .config import ConfigError, PetlConfig

EXAMPLES = {
    "count": "petl-nas count --model all-MiniLM-L6-v2 --preset mam\n"
             "  petl-nas count --model ./my-bert --config best.yaml --json",
    "presets": "petl-nas presets --model all-MiniLM-L6-v2",
}


def _config_from_args(args, model_config) -> tuple[str, PetlConfig]:
    from .presets import preset

    if bool(args.preset) == bool(args.config):
        raise ConfigError("give exactly one of --preset NAME or --config FILE")
    if args.preset:
        return args.preset, preset(args.preset, model_config)
    return args.config, PetlConfig.from_yaml(args.config)


def cmd_count(args) -> int:
    from .budget import count_parameters
    from .models import load_model_config

    model_config = load_model_config(args.model, args.num_labels)
    label, config = _config_from_args(args, model_config)
    count = count_parameters(model_config, config)
    if args.json:
        print(json.dumps({"config": label, "model": args.model, "trainable": count.trainable,
                          "deployable": count.deployable, "backbone": count.backbone, "head": count.head,
                          "rows": [r.__dict__ for r in count.rows]}, indent=2))
    else:
        print(f"{label} on {args.model} ({model_config.model_type}, d={model_config.hidden_size}, "
              f"{model_config.num_hidden_layers} layers)")
        print(count.table())
    return 0


def cmd_presets(args) -> int:
    from .presets import preset, preset_doc, preset_names

    model_config = None
    if args.model:
        from .budget import count_parameters
        from .models import load_model_config

        model_config = load_model_config(args.model)
    for name in preset_names():
        line = f"{name:<16}"
        if model_config is not None:
            c = count_parameters(model_config, preset(name, model_config))
            line += f"{c.deployable:>12,}  {c.deployable_pct:6.3f}%  "
        doc = " ".join(preset_doc(name).split())
        print(line + (doc if len(doc) <= 90 else doc[:87] + "..."))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="petl-nas", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("count", help="exact trainable and deployable parameter counts",
                       epilog="example:\n  " + EXAMPLES["count"],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="local transformers directory or hub name")
    p.add_argument("--preset", help="a named preset (see `petl-nas presets`)")
    p.add_argument("--config", help="a PetlConfig YAML or JSON file")
    p.add_argument("--num-labels", type=int, default=2, help="size of the task head (1 = regression)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_count)

    p = sub.add_parser("presets", help="list the named presets (with counts if --model is given)",
                       epilog="example:\n  " + EXAMPLES["presets"],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="local transformers directory or hub name")
    p.set_defaults(func=cmd_presets)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError) as e:
        print(f"petl-nas: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
