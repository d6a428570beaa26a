"""The profiles shipped with flowbeat, and their data, as package data.

An installed flowbeat finds them here, through ``importlib.resources``, whatever the working
directory; ``FLOWBEAT_PROFILES_DIR`` adds a directory of an operator's own before them.
"""
