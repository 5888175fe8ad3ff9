"""The errors a script says to its user in one line: `error: <message>`, exit 2 (onu_cli.run_script).

Pure Python, importing nothing of this repo: every module can raise them, the data modules included. The commands
these messages give to paste are built by shell_command.
"""
import re
import shlex


class UserError(Exception):
    """A problem the user fixes (a folder in use, a damaged checkpoint, ...); str(error) is one line naming the
    path and the fix."""


class DataError(UserError):
    """A problem with the user's data: photos, records, labels, or what a run recorded of them."""


def shell_flag(name, value):
    """`--name=value`, value quoted for a POSIX shell; a `<placeholder>` is left as it is, for the user to replace."""
    value = str(value)
    return f'--{name}={value if re.fullmatch(r"<[^<>]+>", value) else shlex.quote(value)}'


def shell_command(script, *switches, **flag_values):
    """The command line that runs `python script --name=value ... --switch ...`, each value quoted for a POSIX shell:
    every command a message gives the user to paste is built here, so a path with a space or a quote pastes whole."""
    words = [shell_flag(name, value) for name, value in flag_values.items()] + [f'--{name}' for name in switches]
    return ' '.join(['python', script] + words)
