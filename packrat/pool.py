"""`python -m packrat.pool FD`, kept working: an instance process (see packrat/serving/pool/child.py)."""
if __name__ == "__main__":
    import sys
    from multiprocessing.connection import Connection

    from packrat.serving.pool.child import main

    main(Connection(int(sys.argv[1])))
