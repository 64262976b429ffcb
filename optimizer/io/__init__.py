"""Stage `load`: problem, system, catalog and run files read into typed schemas, with file:line:field errors
(`loader`), Hugging Face `config.json` import (`hf_config`) and published runs mapped onto problems
(`runs`)."""
