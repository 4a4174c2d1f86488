"""The one exception the finetune library raises for problems a user can fix (a missing split, an export of
the wrong kind, a report that does not pair): the CLI prints its message on one line and exits 1. Library
code never raises SystemExit."""


class UserError(ValueError):
    """A problem with the user's input or settings; the message is complete and names what to change."""
