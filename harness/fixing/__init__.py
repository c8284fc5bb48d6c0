"""Fixes as patches to a user's own script (``distdoctor run --fix``): a remedy edits the
lines a finding names on the script's concrete syntax tree, a re-run of the patched copy
on real ranks verifies it, and only a verified patch is shown, saved or applied."""
