"""The one exception type of `lenx.data`."""


class DataError(Exception):
    """A data problem the user can fix; the message is one line saying how."""
