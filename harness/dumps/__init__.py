"""torch's Flight Recorder dumps, from any job: what each rank's recorder held when it was
dumped (on a watchdog timeout, on demand, or by distdoctor beside its traces), read as the
evidence the checks already judge. Files come from elsewhere: read as plain data only,
never executed; whatever cannot be read is said, not guessed."""
