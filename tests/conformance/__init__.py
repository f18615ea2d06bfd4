"""Django's Tasks API contract, as Django's own tests state it, for our database backend."""
