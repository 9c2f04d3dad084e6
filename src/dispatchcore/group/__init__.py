"""group"""
