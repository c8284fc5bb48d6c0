"""``python -m distdoctor.userjob [--trace-dir DIR] SCRIPT [ARGS...]``: one traced rank of a
user's script (see ``distdoctor.userjob.inrank.bootstrap``)."""

from distdoctor.userjob.inrank.bootstrap import main

if __name__ == "__main__":
    main()
