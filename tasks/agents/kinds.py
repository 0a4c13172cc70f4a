"""The built-in agent kinds, registered in :mod:`tasks.agents.registry`: ``oracle`` (the
reference solutions), ``openai:<model>`` (an OpenAI-compatible API), ``local:<model>`` (a
GGUF model served by llama.cpp) and ``replay:<file>`` (recorded answers). Each suite runs them
with its own code (trials: :class:`tasks.trials.agent_runner._Agent`; text2sql:
``make_generator``; lifecycle: ``make_agent``); here they are declared and their
arguments checked."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tasks.agents.registry import SUITES, AgentKind, agentkind
from tasks.core.llm import AgentConfigError


@agentkind("oracle")
class OracleKind(AgentKind):
    """The trusted oracle: runs the reference solutions (reads the private scoring file)."""

    takes_arg = False
    usage = "oracle"
    suites = SUITES
    prompted = False
    trusted = True


@agentkind("openai")
class OpenAIKind(AgentKind):
    """A model behind an OpenAI-compatible API (``openai:<model>[@endpoint]``)."""

    usage = "openai:<model>"
    suites = SUITES


@agentkind("local")
class LocalKind(AgentKind):
    """A local GGUF model served in-process by xllamacpp (``local:<model>``)."""

    usage = "local:<model>"
    suites = SUITES


@agentkind("replay")
class ReplayKind(AgentKind):
    """Recorded answers replayed (trials: an answer file; text2sql: a directory or .jsonl;
    lifecycle: a .jsonl file)."""

    usage = {"trials": "replay:<answer file>", "text2sql": "replay:<path>",
             "lifecycle": "replay:<file.jsonl>"}
    suites = SUITES
    prompted = False
    trusted = True

    def label(self, arg: str) -> str:
        """``replay:<file name without its last extension>`` (a directory: its name)."""
        return f"replay:{Path(arg).stem}"

    def fingerprint(self, arg: str | None) -> str | None:
        """The SHA-256 (hex) of the file's bytes, or of every file of a directory (relative
        path and bytes, in path order); None without an argument. OSError when unreadable."""
        if not arg:
            return None
        path, h = Path(arg), hashlib.sha256()
        if path.is_dir():
            for f in sorted(p for p in path.rglob("*") if p.is_file()):
                h.update(str(f.relative_to(path)).encode() + b"\0")
                h.update(hashlib.sha256(f.read_bytes()).digest())
        else:
            h.update(path.read_bytes())
        return h.hexdigest()

    def trials_per_query(self, arg: str | None, manifest: dict) -> int:
        """1 + the largest run the answer file has for the dataset (0 when it answers none
        of its queries)."""
        from tasks.agents.replay import answers_for, load_answers

        answers = answers_for(load_answers(str(arg)), manifest)
        return 1 + max((run for _, run in answers), default=-1)

    def check(self, arg: str | None, suite: str) -> None:
        """text2sql: the path must exist; lifecycle: it must be a file; trials read (and
        check) the answer file when planning."""
        if suite == "text2sql" and not Path(str(arg)).exists():
            raise AgentConfigError(f"{arg}: replay source not found (a directory or a .jsonl file)")
        if suite == "lifecycle" and not Path(str(arg)).is_file():
            raise AgentConfigError(f"{arg}: replay file not found (a .jsonl file)")
