"""Golden encodings of every committed schema version; see make_golden.py."""
