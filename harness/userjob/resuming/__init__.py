"""resume-check's own job: a user's script run three times on real ranks (stopped right
after a checkpoint, once through, resumed from it) and the resumed run compared with the
one never stopped. It starts ranks as ``launching`` does and explains a run that failed as
``reporting`` does; ``distdoctor resume-check`` and the grading of a resume exercise ask it.
"""
