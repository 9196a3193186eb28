"""Git as the only durable state: status commits through a temporary index, pushes that survive a
moved remote, and the reading of what the checkout holds."""
