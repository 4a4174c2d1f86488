"""The one exception the library raises for problems a user can fix (a missing split, an export of the wrong
kind, a report that does not pair, an init encoder that does not fit): the commands print its message on one
line and exit 1. Library code never raises SystemExit or prints for the user."""


class UserError(ValueError):
    """A problem with the user's input or settings; the message is complete and names what to change."""
