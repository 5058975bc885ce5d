"""Durable state: what a checkpoint holds and how it is named (``format``), reading,
verifying and writing checkpoint directories (``store``), writing them off the loop's
path and deciding when (``writer``), one live run per directory (``lease``), and output
sinks that hold each epoch once (``output_sinks``).

Imports the ``spark`` package and iterflow's pure Python leaves only."""
