"""Error types. Every user-facing error names what was wrong and how to fix it."""


class LossbedError(Exception):
    """Base class: the CLI prints these as one clear message and exits non-zero."""

    exit_code = 1


class UsageError(LossbedError):
    """Bad input from the user: an option, a profile field, an inventory entry.

    `field` names the option or field, `fix` says what to do instead.
    """

    exit_code = 2

    def __init__(self, field: str, problem: str, fix: str):
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"{field}: {problem}. {fix}")


class EnvironmentProblem(LossbedError):
    """The machine lacks something lossbed needs (root, a kernel feature, a package)."""

    exit_code = 3


class ClusterError(LossbedError):
    """A cluster is missing, already exists, or is in a state that forbids the request."""

    exit_code = 4


class TimedOut(LossbedError):
    """A job that ran past its --timeout-s: its processes were stopped and its impairment
    cleared. Exit 124, as coreutils' timeout says it."""

    exit_code = 124


class NotAResult(LossbedError):
    """A run that measured another network than the one it names: too little of its
    traffic crossed the impairment, or the impairment was never applied."""

    exit_code = 5
