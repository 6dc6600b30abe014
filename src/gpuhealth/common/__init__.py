"""Runtime pieces shared by the agent and the controller: clock, logging, tasks, errors, config."""
