"""``torchbay models ...``: a command-line client of a running server's management API.

Not part of the server process: it speaks HTTP to the management port and imports only
``torchbay.server.errors``.
"""
