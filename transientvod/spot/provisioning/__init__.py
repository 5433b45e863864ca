"""Making and ending the cloud's side of a job: `transientvod aws setup`/`teardown`, the fleet
that keeps N spot instances alive, their user data and watchdog, and what `status` reads back."""
