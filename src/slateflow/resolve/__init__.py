"""Resolvers and the Session: named async sources whose results land in the State."""
