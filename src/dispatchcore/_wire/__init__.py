"""Private parts of the wire layer; the public face is dispatchcore.wire."""
