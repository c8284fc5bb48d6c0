"""Starting a user's job: ``distdoctor run SCRIPT`` (``launcher``: the ranks as torchrun
--standalone starts them, forked where that is the same as fresh, ``forked``) and
``distdoctor run -- COMMAND`` (``command``: any launcher's job, watched from outside), with
the ranks' output passed on in whole lines (``output``).
It imports ``inrank`` (a forked rank runs the bootstrap) and ``watching``; ``cli`` imports it.
"""
