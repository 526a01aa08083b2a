"""Which task the generator runs next: intake, fair share, quarantine, preemption and admission."""
