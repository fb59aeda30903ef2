"""What a misconfigured policy raises (:class:`PolicyError`), apart from the definitions that
raise it and the decisions that carry a policy, so that neither imports the other for it."""


class PolicyError(ValueError):
    """A policy is misconfigured. ``check_id`` is the system check that reports it."""

    def __init__(self, check_id: str, message: str) -> None:
        super().__init__(message)
        self.check_id = check_id
