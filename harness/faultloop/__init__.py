"""The loop on the built-in workloads: run a RunSpec on warm ranks and assess the record
(every check, the spread between replicas, the distance from one process), and ``diagnose``:
inject a fault, run, detect, apply the fix the findings carry, run again and judge.

It sits above both workloads, so it imports ``training``, ``pipeline``, ``launch``,
``trace``, ``models``, ``checks`` and ``faults``; only ``cli`` imports it.
"""
