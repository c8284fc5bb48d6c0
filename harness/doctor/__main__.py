"""``python -m harness.doctor [--trace-dir DIR] SCRIPT [ARGS...]``: one traced rank of a
user's script (see ``harness.doctor.bootstrap``)."""

from harness.doctor.bootstrap import main

if __name__ == "__main__":
    main()
