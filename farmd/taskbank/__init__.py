"""The task bank: per-task pass-rate posteriors, band sampling (p near 1/2) and a difficulty curriculum.

Pure logic for the scheduler to call and persist; see ``bank.py`` for how it chooses.
"""

from farmd.errors import TaskBankError
from farmd.taskbank.bank import SCHEMA_VERSION, BankConfig, BankStatus, Standing, TaskBank, TaskKey
from farmd.taskbank.posterior import BetaModel, Posterior
from farmd.taskbank.seeds import CHECK_HORIZON, SEED_SPACE, SeedSequence

__all__ = ["CHECK_HORIZON", "SCHEMA_VERSION", "SEED_SPACE", "BankConfig", "BankStatus", "BetaModel", "Posterior",
           "SeedSequence", "Standing", "TaskBank", "TaskBankError", "TaskKey"]
