"""Teaching from code: exercises a student edits and the detectors grade.

``course`` holds the exercises in order (a buggy script each, under ``exercises/``, its
task, its fix and the wrong fixes students make); ``grading`` runs a student's attempt on
real ranks at two world sizes and says passed, or what is still wrong.
"""
