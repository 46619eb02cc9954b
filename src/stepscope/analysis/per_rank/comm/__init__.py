"""One rank's collectives: each one found and timed (`collectives`), the op the job issued behind what a backend ran
(`issued`, `issued_ops`), the process groups they ran in (`groups`) and their time not hidden by compute
(`exposed`)."""
