"""The desired-state objects users write, their JSON Schemas, the checks a schema cannot express,
loading a repository with every problem located, and the catalog of rental offers."""
