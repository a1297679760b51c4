"""The ``sensevoice`` console script (pyproject.toml): one command, three faces.

    sensevoice serve [app options]        the web app (app_sensevoice.main: UI, REST API, probes)
    sensevoice transcribe PATHS... [...]  the batch CLI (pipeline.cli.main), here or on --server URL
    sensevoice doctor [...]               what this machine has, each problem with what to do

``python -m pipeline ...`` is the same command. Each face is imported only when chosen, so
``sensevoice --help`` and ``sensevoice doctor`` start without the web stack.
"""

from __future__ import annotations

import sys

COMMANDS = {
    "serve": ("app_sensevoice", "the web app: Gradio UI, REST API, health probes"),
    "transcribe": ("pipeline.cli", "transcribe files and folders (locally or on --server URL)"),
    "doctor": ("pipeline.doctor", "check Python, torch, CUDA, GPUs, PyAV, the model, data dir, broker"),
}


def usage() -> str:
    lines = ["usage: sensevoice {serve,transcribe,doctor} [options]", "", "commands:"]
    lines += [f"  {name:<11} {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "sensevoice COMMAND --help shows a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"sensevoice: unknown command {command!r}\n{usage()}", file=sys.stderr)
        return 2
    import importlib

    if argv is None:  # the command's usage line names it as typed ("sensevoice serve")
        sys.argv[0] = f"sensevoice {command}"
    module = importlib.import_module(COMMANDS[command][0])
    return module.main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
