"""``nezharun``, the job launcher (entry point: ``nezha.runner.launch:main``)."""
