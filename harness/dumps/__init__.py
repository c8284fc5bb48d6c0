"""torch's Flight Recorder dumps, from any job: what each rank's recorder held when it was
dumped (on a watchdog timeout, on demand, or by distdoctor beside its traces), read as the
evidence the checks already judge. Files come from elsewhere: read as plain data only,
never executed; whatever cannot be read is said, not guessed.

Every piece of Flight Recorder code is here: asking a live rank's recorder (``live``: the
collectives in flight, the history, the dump bytes, called in the rank by the stack thread
and the stall watch), finding and reading dump files (``files``, ``read``, ``collect``), the
one vocabulary of a dump's fields (``schema``) and turning dumps into a job's record
(``job``). ``attach`` asks a job's ranks for dumps through torch's dump pipe and reads them
here."""
