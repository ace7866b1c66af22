"""Test support: read a provenance document with the in-toto attestation bindings, whose JSON
parser refuses any field the in-toto Statement v1 or the SLSA provenance v1 message does not have
(a misspelt or misplaced key), then the bindings' own validate()."""

from google.protobuf import json_format
from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement

ParseError = json_format.ParseError


def parse(document: dict):
    """(Statement, Provenance) protobuf messages of a provenance document; ParseError or
    ValueError when it is not one."""
    statement = json_format.ParseDict(document, statement_pb2.Statement())
    Statement.copy_from_pb(statement).validate()
    return statement, json_format.ParseDict(document["predicate"], provenance_pb2.Provenance())
