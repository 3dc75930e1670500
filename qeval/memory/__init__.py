"""Memory: the ledger (predictions and byte counting), the capacity formula, `qeval plan`."""
