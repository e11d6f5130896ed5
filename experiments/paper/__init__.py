"""The write-up's reported numbers, as data (`reported.py`), for side-by-side tables."""
