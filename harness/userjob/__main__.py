"""``python -m distdoctor.userjob [--trace-dir DIR] SCRIPT [ARGS...]``: one traced rank of a
user's script (see ``distdoctor.userjob.bootstrap``)."""

from distdoctor.userjob.bootstrap import main

if __name__ == "__main__":
    main()
