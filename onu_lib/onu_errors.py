"""The errors a script says to its user in one line: `error: <message>`, exit 2 (onu_cli.run_script).

Pure Python, importing nothing of this repo: every module can raise them, the data modules included.
"""


class UserError(Exception):
    """A problem the user fixes (a folder in use, a damaged checkpoint, ...); str(error) is one line naming the
    path and the fix."""


class DataError(UserError):
    """A problem with the user's data: photos, records, labels, or what a run recorded of them."""
