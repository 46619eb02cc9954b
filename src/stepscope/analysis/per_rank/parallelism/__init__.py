"""One rank's share of each kind of parallelism: FSDP's units (`fsdp`), expert (`expert`) and tensor (`tensor`)
parallel, a pipeline's stages (`pipeline`)."""
