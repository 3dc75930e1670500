"""Errors a user can cause: the CLI turns them into one line on stderr and exit code 2."""


class UserError(Exception):
    """Bad input (config, task file, dataset line, setup/device pairing): exit code 2."""
