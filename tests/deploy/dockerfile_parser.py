"""Reads a Dockerfile into its global ARGs and stages, enough for tests/deploy's checks.

Continuation lines are joined and comments dropped; each instruction is (KEYWORD, arguments).
Heredocs and parser directives other than comments are not supported (kiln's Dockerfile uses none).
"""

import re
import shlex


class Stage:
    """One FROM ... [AS name] and the instructions under it."""

    def __init__(self, base, name):
        self.base = base  # the image or stage it starts from, ${ARG}s unexpanded
        self.name = name  # its AS name, or None
        self.instructions = []  # [(KEYWORD, arguments)]

    def all(self, keyword):
        return [args for kw, args in self.instructions if kw == keyword]

    def env(self):
        """The ENV values this stage sets (both KEY=VALUE and the legacy KEY VALUE form)."""
        values = {}
        for args in self.all("ENV"):
            words = shlex.split(args)
            if words and "=" not in words[0]:
                values[words[0]] = args.split(None, 1)[1] if len(words) > 1 else ""
                continue
            for word in words:
                key, _, value = word.partition("=")
                values[key] = value
        return values


def instructions(text):
    """The Dockerfile's instructions in order, as (KEYWORD, arguments)."""
    result, pending = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line:
            keyword, _, args = line.partition(" ")
            result.append((keyword.upper(), args.strip()))
    if pending.strip():
        keyword, _, args = pending.strip().partition(" ")
        result.append((keyword.upper(), args.strip()))
    return result


def parse(text):
    """(global ARG defaults, [Stage]) of a Dockerfile's text."""
    global_args, stages = {}, []
    for keyword, args in instructions(text):
        if keyword == "FROM":
            words = [w for w in args.split() if not w.startswith("--platform")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        elif not stages:
            if keyword == "ARG":
                key, _, value = args.partition("=")
                global_args[key.strip()] = value.strip()
        else:
            stages[-1].instructions.append((keyword, args))
    return global_args, stages


def copy_from(args):
    """(source stage, [source paths], destination) of a COPY --from=... instruction, else None."""
    words = shlex.split(args)
    stage = None
    paths = []
    for word in words:
        match = re.fullmatch(r"--from=(\S+)", word)
        if match:
            stage = match.group(1)
        elif not word.startswith("--"):
            paths.append(word)
    if stage is None or len(paths) < 2:
        return None
    return stage, paths[:-1], paths[-1]
